"""The official OpenAI Python SDK against the running server, with its default settings."""

from __future__ import annotations

import json
from collections.abc import Sequence

import openai
import pytest
from openai.types.completion_create_params import CompletionCreateParamsBase

from tests.clients.conftest import Server


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_completion_with_defaults(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="generator", prompt="The Congress of the United States")
    (choice,) = completion.choices
    assert completion.object == "text_completion" and completion.model == "generator"
    assert completion.usage is not None
    assert choice.finish_reason in ("stop", "length") and completion.usage.completion_tokens <= 16


def test_default_budget_of_other_clients_is_clamped(client: openai.OpenAI) -> None:
    """LangChain's OpenAI wrapper sends max_tokens 256 by default: with a prompt, that exceeds the
    generator's 256 positions, so it is clamped to what fits and ends with "length"."""
    prompt = "Fellow citizens of the Senate and House of Representatives. " * 8
    completion = client.completions.create(
        model="generator", prompt=prompt, max_tokens=256, temperature=0.7, extra_body={"ignore_eos": True}
    )
    usage = completion.usage
    assert usage is not None
    assert completion.choices[0].finish_reason == "length"
    assert usage.prompt_tokens + usage.completion_tokens == 256


def test_stream_matches_whole(client: openai.OpenAI) -> None:
    args: CompletionCreateParamsBase = {"model": "generator", "prompt": "Our nation must", "max_tokens": 24,
                                        "temperature": 0}
    whole = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True) if c.choices)
    assert streamed == whole


def test_echo_logprobs(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="generator", prompt="Peace and", max_tokens=0, echo=True, logprobs=1)
    logprobs = completion.choices[0].logprobs
    assert completion.choices[0].text == "Peace and"
    assert logprobs is not None and logprobs.token_logprobs is not None
    token_logprobs: Sequence[float | None] = logprobs.token_logprobs  # the SDK says float; the echoed first has none
    assert token_logprobs[0] is None and all(x is not None and x < 0 for x in token_logprobs[1:])


def test_models(client: openai.OpenAI) -> None:
    assert {"translator", "generator", "classifier"} <= {m.id for m in client.models.list()}
    assert client.models.retrieve("generator").id == "generator"


def test_errors_fill_param_and_code(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as wrong_model:
        client.completions.create(model="gpt-4", prompt="x")
    assert wrong_model.value.code == "model_not_found" and wrong_model.value.param == "model"
    with pytest.raises(openai.UnprocessableEntityError) as bad:
        client.completions.create(model="generator", prompt="x", temperature=5)
    assert bad.value.param == "temperature" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.UnprocessableEntityError) as unknown:  # unknown fields: a clear 422
        client.completions.create(model="generator", prompt="x", extra_body={"frobnicate": 1})
    assert unknown.value.param == "frobnicate"


def test_request_ids_reach_the_json_log(client: openai.OpenAI, server: Server) -> None:
    raw = client.completions.with_raw_response.create(
        model="generator", prompt="x", max_tokens=2, extra_headers={"x-request-id": "sdk-test-1"}
    )
    assert raw.headers["x-request-id"] == "sdk-test-1" and int(raw.headers["x-total-time"]) >= 0
    lines = [json.loads(line) for line in server.log_lines() if line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line.get("request_id") == "sdk-test-1" for line in lines)  # uvicorn's access line



def test_field_errors_name_the_sdk_argument(client: openai.OpenAI) -> None:
    """best_of (a cross-field check) and a top_k past int64 (a 500 once) are 422s naming the argument; a
    max_tokens beyond the context is clamped (it was a 422 naming max_new_tokens); a prompt that fills the
    context can be scored (it was refused)."""
    with pytest.raises(openai.UnprocessableEntityError) as best_of:
        client.completions.create(model="generator", prompt="x", max_tokens=2, best_of=3)
    assert best_of.value.param == "best_of"
    with pytest.raises(openai.UnprocessableEntityError) as top_k:
        client.completions.create(model="generator", prompt="x", max_tokens=2, extra_body={"top_k": 2**63})
    assert top_k.value.param == "top_k"
    clamped = client.completions.create(model="generator", prompt="x", max_tokens=2000, extra_body={"ignore_eos": True})
    assert clamped.usage is not None
    assert clamped.choices[0].finish_reason == "length" and clamped.usage.total_tokens == 256
    echo = client.completions.create(model="generator", prompt=[5] * 256, max_tokens=0, echo=True, logprobs=1)
    logprobs = echo.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert len(logprobs.token_logprobs) == 256
