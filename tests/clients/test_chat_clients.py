"""Chat clients against the running server with their defaults, on the tiny chat import (a ChatML template):
the OpenAI SDK's chat.completions, LangChain's ChatOpenAI, huggingface_hub's InferenceClient.chat_completion;
and the 400 they get from a model without a chat template."""

from __future__ import annotations

import json

import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.chat.completion_create_params import CompletionCreateParamsBase, CompletionCreateParamsStreaming
from pydantic import SecretStr

from tests.clients.conftest import Server

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Where is the train station?"},
]


@pytest.fixture(scope="module")
def client(chat_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{chat_server.url}/v1", api_key="unused", max_retries=0)


def test_openai_chat_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, seed=1)
    (choice,) = completion.choices
    assert completion.object == "chat.completion" and completion.model == "chat"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert completion.usage is not None
    assert choice.finish_reason in ("stop", "length") and completion.usage.completion_tokens <= 8
    assert completion.usage.prompt_tokens > 10  # the template's system and role headers are in the prompt


def test_openai_stream_with_usage_matches_whole(client: openai.OpenAI) -> None:
    args: CompletionCreateParamsBase = {"model": "chat", "messages": MESSAGES, "max_completion_tokens": 12,
                                        "temperature": 0}
    whole = client.chat.completions.create(**args)
    streaming: CompletionCreateParamsStreaming = {**args, "stream": True, "stream_options": {"include_usage": True}}
    stream = list(client.chat.completions.create(**streaming))
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert stream[-1].choices == [] and stream[-1].usage == whole.usage


def test_openai_n_and_logprobs(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=6, n=2, seed=7,
                                                logprobs=True, top_logprobs=3)
    assert [c.index for c in completion.choices] == [0, 1]
    for choice in completion.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        content = choice.logprobs.content
        assert "".join(t.token for t in content) == choice.message.content
        assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)


def test_openai_errors_name_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as no_template:
        client.chat.completions.create(model="generator", messages=MESSAGES)
    assert no_template.value.status_code == 400 and no_template.value.param == "model"
    assert "/v1/completions" in no_template.value.message
    with pytest.raises(openai.UnprocessableEntityError) as bad_regex:
        client.chat.completions.create(model="chat", messages=MESSAGES, extra_body={"guided_regex": "(unclosed"})
    assert bad_regex.value.param == "guided_regex"
    with pytest.raises(openai.UnprocessableEntityError) as tools:
        client.chat.completions.create(model="chat", messages=MESSAGES, tools=[TOOL],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert tools.value.param == "tool_choice.function.name"


TOOL: ChatCompletionFunctionToolParam = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["C", "F"]}}, "required": ["unit"],
    "additionalProperties": False}}}


def test_openai_tool_call(client: openai.OpenAI) -> None:
    """A named function with the SDK's types: its call, parsed from the model's Llama 3 JSON (the ChatML
    template writes no <tool_call>), whole and streamed."""
    completion = client.chat.completions.create(
        model="chat", messages=MESSAGES, tools=[TOOL], seed=2,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] in ("C", "F")
    stream = client.chat.completions.create(
        model="chat", messages=MESSAGES, tools=[TOOL], seed=2, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    deltas = [d for c in stream for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas if d.function] == [
        (0, "get_weather", call.function.arguments)]


def test_langchain_chat_openai_invoke_and_stream(chat_server: Server) -> None:
    llm = ChatOpenAI(base_url=f"{chat_server.url}/v1", api_key=SecretStr("unused"), model="chat",
                     max_retries=0)
    messages = [SystemMessage("Answer briefly."), HumanMessage("Where is the train station?")]
    reply = llm.invoke(messages)
    assert isinstance(reply.content, str) and reply.response_metadata["finish_reason"] in ("stop", "length")
    assert reply.usage_metadata is not None and reply.usage_metadata["input_tokens"] > 10
    pieces = list(llm.stream(messages))
    assert len(pieces) > 1 and all(isinstance(p, AIMessageChunk) for p in pieces)
    joined = pieces[0]
    for piece in pieces[1:]:
        joined += piece
    assert isinstance(joined.content, str) and joined.content


def test_huggingface_hub_chat_completion(chat_server: Server) -> None:
    client = InferenceClient(model=chat_server.url, timeout=60)  # sends model "dummy" to a URL
    messages = [dict(m) for m in MESSAGES]
    output = client.chat_completion(messages, max_tokens=8, seed=3)
    assert output.choices[0].message.role == "assistant" and output.choices[0].finish_reason in ("stop", "length")
    assert output.model == "chat" and output.usage.completion_tokens <= 8
    pieces = list(client.chat_completion(messages, max_tokens=8, seed=3, stream=True))
    text = "".join(p.choices[0].delta.content or "" for p in pieces if p.choices)
    assert text == output.choices[0].message.content
    assert pieces[-1].choices[0].finish_reason == output.choices[0].finish_reason


def test_huggingface_hub_chat_error(chat_server: Server) -> None:
    client = InferenceClient(model=chat_server.url, timeout=60)
    with pytest.raises(HfHubHTTPError) as bad:
        client.chat_completion([{"role": "wizard", "content": "hi"}])
    assert bad.value.response.status_code == 422
    assert bad.value.response.json()["error"]["param"] == "messages[0].role"
