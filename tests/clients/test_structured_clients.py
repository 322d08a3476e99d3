"""Structured outputs from the clients people use, with their defaults, on the tiny chat import (random
weights): the OpenAI SDK's `chat.completions.parse` with a pydantic model, LangChain's
`with_structured_output`, vLLM's `extra_body` fields, and huggingface_hub's `chat_completion` with a JSON
schema. The schemas bound every string and number, so a random model must finish them."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import openai
import pytest
from huggingface_hub import ChatCompletionInputJSONSchema, ChatCompletionInputResponseFormatJSONSchema, InferenceClient
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field, SecretStr

from tests.clients.conftest import Server

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Describe a person."}]


class Person(BaseModel):
    name: Annotated[str, Field(max_length=12)]
    age: Annotated[int, Field(ge=0, le=120)]
    mood: Literal["happy", "sad"]


@pytest.fixture(scope="module")
def client(chat_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{chat_server.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_openai_parse_with_a_pydantic_model(client: openai.OpenAI, temperature: float) -> None:
    completion = client.chat.completions.parse(
        model="chat", messages=MESSAGES, response_format=Person, temperature=temperature, seed=4
    )
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person)
    assert completion.choices[0].finish_reason == "stop"


def test_openai_json_mode_and_vllm_extra_body(client: openai.OpenAI) -> None:
    json_mode = client.chat.completions.create(
        model="chat", messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=48
    )
    assert isinstance(json.loads(json_mode.choices[0].message.content or ""), dict)
    choice = client.chat.completions.create(
        model="chat", messages=MESSAGES, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert choice.choices[0].message.content in ("yes", "no")
    completion = client.completions.create(model="chat", prompt="Code:", extra_body={"guided_regex": "[A-Z]{3}[0-9]"})
    assert len(completion.choices[0].text) == 4


def test_langchain_with_structured_output(chat_server: Server) -> None:
    llm = ChatOpenAI(base_url=f"{chat_server.url}/v1", api_key=SecretStr("unused"), model="chat", max_retries=0)
    person = llm.with_structured_output(Person).invoke("Describe a person.")
    assert isinstance(person, Person)


def test_huggingface_hub_chat_completion_with_a_json_schema(chat_server: Server) -> None:
    client = InferenceClient(base_url=chat_server.url)
    schema = Person.model_json_schema()
    response_format = ChatCompletionInputResponseFormatJSONSchema(
        type="json_schema", json_schema=ChatCompletionInputJSONSchema(name="person", schema=schema)
    )
    messages = [dict(m) for m in MESSAGES]
    output = client.chat_completion(messages=messages, response_format=response_format, max_tokens=64, seed=2)
    Person.model_validate_json(output.choices[0].message.content or "")


class Mood(BaseModel):
    """A tool small enough for the tiny model's context of 128 tokens."""

    mood: Literal["happy", "sad"]


@pytest.mark.parametrize("tool_choice", ["Mood", "any"])
def test_langchain_bind_tools_with_tool_choice(chat_server: Server, tool_choice: str) -> None:
    """A named tool and "any" (OpenAI's required): a call whose arguments LangChain parses and the tool's
    schema validates; the call and its result then go back as an AIMessage and a ToolMessage."""
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = ChatOpenAI(base_url=f"{chat_server.url}/v1", api_key=SecretStr("unused"), model="chat", max_retries=0,
                     temperature=1.0, seed=3)
    bound = llm.bind_tools([Mood], tool_choice=tool_choice, parallel_tool_calls=False)
    question = HumanMessage("Describe a person.")
    reply = bound.invoke([question])
    (call,) = reply.tool_calls
    assert call["name"] == "Mood" and reply.response_metadata["finish_reason"] == "tool_calls"
    Mood.model_validate(call["args"])
    answer = llm.invoke([question, reply, ToolMessage("ok", tool_call_id=call["id"] or "")])
    assert isinstance(answer.content, str)


def test_litellm_structured_output_and_a_named_tool_call(chat_server: Server) -> None:
    import litellm

    common = {"model": "openai/chat", "api_base": f"{chat_server.url}/v1", "api_key": "unused", "num_retries": 0}
    answer = litellm.completion(messages=[dict(m) for m in MESSAGES], response_format=Person, **common)
    Person.model_validate_json(answer.choices[0].message.content)
    tool = {"type": "function", "function": {"name": "mood", "parameters": Person.model_json_schema()}}
    called = litellm.completion(
        messages=[dict(m) for m in MESSAGES], tools=[tool], max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "mood"}}, **common,
    )  # fmt: skip
    [call] = called.choices[0].message.tool_calls
    assert call.function.name == "mood"
    Person.model_validate_json(call.function.arguments)
