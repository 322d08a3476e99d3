import asyncio

import numpy as np
import pytest

from service.engine.tokens.streaming import REPLACEMENT
from tests.service.sse_events import events


async def test_generate(served) -> None:
    r = await served.client.post(
        "/v1/generate", json={"prompt": "Hello", "max_new_tokens": 6, "seed": 3, "ignore_eos": True}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "generator" and body["finish_reason"] == "length" and body["seed"] == 3
    assert body["usage"]["completion_tokens"] == 6
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 6
    assert "tokens" not in body and "attention" not in body


async def test_same_seed_same_text_and_logprobs(served) -> None:
    req = {"prompt": "Hello", "max_new_tokens": 8, "seed": 42, "logprobs": True, "top_logprobs": 3, "ignore_eos": True}
    a, b = (
        (await served.client.post("/v1/generate", json=req)).json(),
        (await served.client.post("/v1/generate", json=req)).json(),
    )
    assert a["text"] == b["text"] and a["tokens"] == b["tokens"]
    assert len(a["tokens"]) == 8
    for token in a["tokens"]:
        assert token["logprob"] <= 0 and len(token["top_logprobs"]) == 3
        assert token["top_logprobs"][0]["logprob"] >= token["logprob"] - 1e-9


async def test_stream_format(served) -> None:
    req = {"prompt": "Hello", "max_new_tokens": 7, "seed": 1, "stream": True, "ignore_eos": True}
    r = await served.client.post("/v1/generate", json=req)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    parsed = events(r.content)
    names = [name for name, _ in parsed]
    assert names == ["token"] * 7 + ["done"]
    assert [d["index"] for _, d in parsed[:-1]] == list(range(7))
    done = parsed[-1][1]
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 7
    assert "".join(d["text"] for _, d in parsed[:-1]) == done["text"]
    whole = (await served.client.post("/v1/generate", json={**req, "stream": False})).json()
    assert whole["text"] == done["text"]


async def test_stream_never_splits_a_character(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the model to spell multi-byte characters whose bytes span several byte-level tokens."""
    gen = served.engine.generator
    text = "東京 🙂 café"
    script = gen.tokenizer.encode(text).ids
    assert any(REPLACEMENT in gen.tokenizer.decode([i]) for i in script)
    original = gen.model.run

    def scripted(input_ids, cache, new_mask, attention):
        logits, cache, attn = original(input_ids, cache, new_mask, attention)
        step = cache.mask.sum(axis=1)[0] - prompt_len
        forced = np.full_like(logits, -1e9)
        forced[:, script[min(step, len(script) - 1)]] = 0.0
        return forced, cache, attn

    prompt_len = len(gen.tokenize("Hi", "prompt"))
    monkeypatch.setattr(gen.model, "run", scripted)
    req = {"prompt": "Hi", "max_new_tokens": len(script), "stream": True, "temperature": 0, "ignore_eos": True}
    parsed = events((await served.client.post("/v1/generate", json=req)).content)
    pieces = [d["text"] for name, d in parsed if name == "token"]
    assert len(pieces) == len(script)  # one event per token, some of them empty
    assert "".join(pieces) == text == parsed[-1][1]["text"]
    assert all(REPLACEMENT not in p for p in pieces)
    assert "" in pieces


async def test_stream_error_after_first_event(served, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = served.engine.generator
    original, calls = gen.model.run, []

    def failing(*args):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("device lost")
        return original(*args)

    monkeypatch.setattr(gen.model, "run", failing)
    r = await served.client.post(
        "/v1/generate", json={"prompt": "Hi", "max_new_tokens": 10, "stream": True, "ignore_eos": True}
    )
    assert r.status_code == 200
    parsed = events(r.content)
    assert parsed[0][0] == "token" and parsed[-1][0] == "error"
    assert parsed[-1][1]["error"]["type"] == "inference_failed"
    monkeypatch.setattr(gen.model, "run", original)
    ok = await served.client.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 2})
    assert ok.status_code == 200  # the engine survives a failed batch


async def test_concurrent_requests_each_get_their_own_result(served) -> None:
    reqs = [
        {"prompt": p, "max_new_tokens": 6, "seed": i, "ignore_eos": True} for i, p in enumerate(["a", "bb", "ccc"] * 4)
    ]
    alone = [(await served.client.post("/v1/generate", json=req)).json()["text"] for req in reqs]
    together = await asyncio.gather(*(served.client.post("/v1/generate", json=req) for req in reqs))
    assert [r.json()["text"] for r in together] == alone


async def test_attention(served) -> None:
    r = await served.client.post(
        "/v1/generate", json={"prompt": "Hello", "max_new_tokens": 3, "return_attention": True}
    )
    attention = r.json()["attention"]
    n = r.json()["usage"]["prompt_tokens"] + 2  # the last token is never fed back
    layers = np.array(attention["layers"])
    assert layers.shape == (2, 2, n, n) and len(attention["tokens"]) == n
    np.testing.assert_allclose(layers.sum(-1), 1.0, atol=1e-3)  # rows are distributions
    assert np.allclose(np.triu(layers, 1), 0)  # causal


BAD_GENERATE = [
    ({"prompt": ""}, "prompt"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": "hi", "max_new_tokens": 33}, "max_new_tokens"),
    ({"prompt": "hi", "top_logprobs": 2}, None),
    ({"prompt": "hi", "stop": [""]}, "stop[0]"),
    ({"prompt": "hi", "seed": -1}, "seed"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": [999999]}, "prompt"),
    ({"prompt": "word " * 300}, "prompt"),
]


async def test_bad_input_is_422_naming_the_field(served) -> None:
    for body, field in BAD_GENERATE:
        r = await served.client.post("/v1/generate", json=body)
        assert r.status_code == 422, (body, r.text)
        error = r.json()["error"]
        assert error["message"]
        if field is not None:
            assert error["field"] == field, body
