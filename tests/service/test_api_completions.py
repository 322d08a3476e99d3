"""The OpenAI completions API: request fields, response shape, streaming chunks ending in [DONE]."""

import json
from typing import Any

BASE = {"model": "generator", "prompt": "Hello", "max_tokens": 5, "seed": 1}


def chunks(body: bytes) -> list[Any]:
    lines = [line for line in body.decode("utf-8").split("\n") if line.startswith("data: ")]
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]


async def test_response_shape(served) -> None:
    r = await served.client.post("/v1/completions", json=BASE)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert isinstance(body["created"], int) and body["model"] == "generator"
    (choice,) = body["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_prompts_times_n_and_echo(served) -> None:
    req = {**BASE, "prompt": ["Hello", "Bye"], "n": 2, "echo": True, "ignore_eos": True}
    body = (await served.client.post("/v1/completions", json=req)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][0]["text"].startswith("Hello") and body["choices"][2]["text"].startswith("Bye")
    assert body["usage"]["completion_tokens"] == 4 * 5
    # Token-id prompts work too.
    ids = served.engine.generator.tokenizer.encode("Hello").ids
    same = (await served.client.post("/v1/completions", json={**BASE, "prompt": ids})).json()
    text = (await served.client.post("/v1/completions", json=BASE)).json()["choices"][0]["text"]
    assert same["choices"][0]["text"] == text


async def test_more_choices_than_the_queue_holds_is_a_422_from_the_engine(serving) -> None:
    """The engine checks the per-request limit, for every route, before anything is queued."""
    async with serving(max_queue_size=3) as s:
        r = await s.client.post("/v1/completions", json={**BASE, "prompt": ["a", "b"], "n": 2})
        assert r.status_code == 422 and r.json()["error"]["param"] == "n"
        r = await s.client.post("/v1/classify", json={"text": ["a", "b", "c", "d"]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "text"
        r = await s.client.post("/v1/completions", json={**BASE, "prompt": ["a", "b", "c"], "n": 1})
        assert r.status_code == 200 and len(r.json()["choices"]) == 3
        assert s.engine.generator.scheduler.waiting == 0 and s.engine.classifier.scheduler.waiting == 0


async def test_logprobs_shape(served) -> None:
    req = {**BASE, "logprobs": 2, "ignore_eos": True}
    lp = (await served.client.post("/v1/completions", json=req)).json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(lp["top_logprobs"]) == 5
    assert all(len(top) <= 2 for top in lp["top_logprobs"])


async def test_stream_chunks_end_with_done(served) -> None:
    req = {**BASE, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    r = await served.client.post("/v1/completions", json=req)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    parsed = chunks(r.content)
    assert parsed[-1] == "[DONE]"
    usage_chunk, finish_chunk, token_chunks = parsed[-2], parsed[-3], parsed[:-3]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
    assert finish_chunk["choices"][0]["finish_reason"] == "length"
    for chunk in token_chunks:
        assert chunk["object"] == "text_completion" and chunk["choices"][0]["finish_reason"] is None
    streamed = "".join(c["choices"][0]["text"] for c in token_chunks)
    whole = (await served.client.post("/v1/completions", json={**BASE, "ignore_eos": True})).json()
    assert streamed == whole["choices"][0]["text"]


async def test_stream_with_several_choices(served) -> None:
    r = await served.client.post("/v1/completions", json={**BASE, "n": 3, "stream": True})
    parsed = chunks(r.content)
    finished = [c["choices"][0]["index"] for c in parsed[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1, 2] and parsed[-1] == "[DONE]"


async def test_openai_errors(served) -> None:
    """OpenAI's error body here (message, type, param, code); the rest of the API keeps the project's."""
    r = await served.client.post("/v1/completions", json={**BASE, "model": "gpt-4"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": r.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert "gpt-4" in r.json()["error"]["message"]
    r = await served.client.post("/v1/completions", json={**BASE, "frobnicate": 1})  # unknown fields: 422
    assert r.status_code == 422 and r.json()["error"]["param"] == "frobnicate"
    assert r.json()["error"]["code"] == "validation_error"
    r = await served.client.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = await served.client.post("/v1/generate", json={"prompt": "x", "frobnicate": 1})
    assert set(r.json()["error"]) >= {"type", "message", "field"} and "param" not in r.json()["error"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"best_of": 3}, "best_of"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"n": 0}, "n"),
        ({"suffix": "x"}, "suffix"),
        ({"temperature": 3}, "temperature"),
        ({"stop": ["a"] * 5}, "stop"),
    ]
    for bad, field in cases:
        r = await served.client.post("/v1/completions", json={**BASE, **bad})
        assert r.status_code == 422, bad
        assert r.json()["error"]["param"] == field


async def test_a_prompt_past_the_context_says_what_to_set(serving) -> None:
    """lm-eval's scoring request (token ids, echo, max_tokens 1) with its default max_length of 2048 sends
    prompts longer than a small model's context: the 422 names the limit, what sets it, and the max_length
    that fits (lm-eval prints the message and nothing else)."""
    async with serving() as s:
        positions = s.engine.generator.artifact.max_positions
        scoring = {"model": "generator", "temperature": 0, "max_tokens": 1, "logprobs": 1, "echo": True}
        r = await s.client.post("/v1/completions", json={**scoring, "prompt": [[5] * positions]})
        error = r.json()["error"]
        assert r.status_code == 422 and error["param"] == "prompt", r.text
        assert f"the prompt has {positions} tokens; the limit is {positions - 1}" in error["message"]
        assert f"context of {positions} positions" in error["message"]
        assert f"--model_args max_length={positions}" in error["message"]
        fits = await s.client.post("/v1/completions", json={**scoring, "prompt": [[5] * (positions - 1)]})
        assert fits.status_code == 200, fits.text  # what lm-eval sends with that max_length
    async with serving(max_input_tokens=8) as s:
        r = await s.client.post("/v1/completions", json={**scoring, "prompt": [[5] * 9]})
        assert "the limit is 8 (SERVE_MAX_INPUT_TOKENS)" in r.text and "max_length=9" in r.text, r.text
