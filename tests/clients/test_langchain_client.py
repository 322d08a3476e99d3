"""LangChain's OpenAI completions wrapper with its defaults (max_tokens 256, temperature 0.7): the budget
does not fit the generator's context with any prompt, so the server clamps it instead of refusing."""

from __future__ import annotations

from langchain_openai import OpenAI
from pydantic import SecretStr

from tests.clients.conftest import Server


def test_invoke_and_stream_with_defaults(server: Server) -> None:
    llm = OpenAI(base_url=f"{server.url}/v1", api_key=SecretStr("unused"), model="generator", max_retries=0)
    assert llm.max_tokens == 256  # LangChain's default, more than fits after a prompt
    prompt = "Fellow citizens of the Senate and House of Representatives:"
    text = llm.invoke(prompt)
    assert isinstance(text, str) and text
    result = llm.generate([prompt])
    info = result.generations[0][0].generation_info
    assert info is not None and info["finish_reason"] in ("stop", "length")
    pieces = list(llm.stream(prompt))
    assert len(pieces) > 1 and "".join(pieces)
