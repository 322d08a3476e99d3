"""The end token through the APIs: it ends a completion without being one of its tokens (no token
event, not in usage), whatever the route."""

import json

import numpy as np
import pytest

from service.engine.tasks.generation import decoding as generation
from service.engine.tokens.chooser import Choice
from tests.service.sse_events import events


@pytest.fixture
def end_at_once(monkeypatch: pytest.MonkeyPatch, served):
    """Every generator row draws the end token first."""
    eos = served.engine.generator.artifact.special_tokens["eos"]
    monkeypatch.setattr(generation, "choose", lambda rows, logits, *masks: Choice(np.full(len(logits), eos)))
    return eos


async def test_generate_counts_no_token_for_the_end(served, end_at_once) -> None:
    body = (await served.client.post("/v1/generate", json={"prompt": "Hello", "logprobs": True})).json()
    assert body["finish_reason"] == "eos" and body["text"] == "" and body["usage"]["completion_tokens"] == 0
    assert body.get("tokens") in (None, [])
    streamed = events((await served.client.post("/v1/generate", json={"prompt": "Hello", "stream": True})).content)
    assert [name for name, _ in streamed] == ["done"]


async def test_completions_count_no_token_for_the_end(served, end_at_once) -> None:
    req = {"model": "generator", "prompt": "Hello", "stream": True, "stream_options": {"include_usage": True}}
    r = await served.client.post("/v1/completions", json=req)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]] == ["stop"]
    assert chunks[-1]["usage"]["completion_tokens"] == 0


async def test_tgi_stream_of_a_lone_end_token(served, end_at_once) -> None:
    r = await served.client.post("/generate_stream", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}})
    chunks = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    (last,) = chunks  # TGI's shape: the end token goes out with the text and details
    assert last["token"]["id"] == end_at_once and last["token"]["special"] and last["generated_text"] == ""
    assert last["details"]["generated_tokens"] == 0 and last["details"]["finish_reason"] == "eos_token"
