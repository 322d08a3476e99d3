"""The OpenAI SDK's embeddings and LangChain's OpenAIEmbeddings against a running server with the tiny
embedder (the committed artifacts have none), each with its defaults: the SDK asks for base64 and decodes it;
LangChain tokenizes with tiktoken (a download, and ids of another vocabulary) unless
check_embedding_ctx_length=False, which it documents for OpenAI-compatible servers."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from pydantic import SecretStr

from tests.clients.conftest import Server

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "stocks fell sharply today"]


@pytest.fixture(scope="module")
def client(encoder_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{encoder_server.url}/v1", api_key="unused", max_retries=0)


def tei_vectors(server: Server, texts: list[str]) -> np.ndarray:
    return np.array(httpx.post(f"{server.url}/embed", json={"inputs": texts}, timeout=30).json())


def test_sdk_defaults_decode_base64(client: openai.OpenAI, encoder_server: Server) -> None:
    one = client.embeddings.create(model="embedder", input=TEXTS[0])  # the SDK asks for base64 and decodes it
    assert one.model == "embedder" and one.object == "list" and len(one.data) == 1
    assert one.usage.prompt_tokens == one.usage.total_tokens > 0
    expected = tei_vectors(encoder_server, TEXTS)
    np.testing.assert_allclose(one.data[0].embedding, expected[0], atol=1e-6)
    many = client.embeddings.create(model="embedder", input=TEXTS)
    assert [d.index for d in many.data] == [0, 1, 2]
    np.testing.assert_allclose([d.embedding for d in many.data], expected, atol=1e-6)
    floats = client.embeddings.create(model="embedder", input=TEXTS, encoding_format="float")
    np.testing.assert_array_equal([d.embedding for d in floats.data], [d.embedding for d in many.data])


def test_sdk_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.UnprocessableEntityError) as empty:
        client.embeddings.create(model="embedder", input=["fine", ""])
    assert empty.value.param == "input[1]"
    with pytest.raises(openai.UnprocessableEntityError) as too_long:
        client.embeddings.create(model="embedder", input="cat dog " * 100)
    assert too_long.value.param == "input" and "limit" in too_long.value.message


def test_langchain_embeddings(encoder_server: Server) -> None:
    embeddings = OpenAIEmbeddings(
        model="embedder", openai_api_base=f"{encoder_server.url}/v1", openai_api_key=SecretStr("unused"),
        check_embedding_ctx_length=False,
        max_retries=0,
    )  # fmt: skip
    expected = tei_vectors(encoder_server, TEXTS)
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), expected, atol=1e-6)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[1]), expected[1], atol=1e-6)
