"""Scoring prompts (echo + logprobs, max_tokens 0), max_tokens clamped to the context, vLLM's tokenizer
routes and /v1/models/{id}: what evaluation harnesses and OpenAI-style clients send by default."""

import math

from tests.service.test_api_completions import chunks

BASE = {"model": "generator", "temperature": 0, "seed": 1}


async def test_echo_logprobs_score_the_prompt_like_generation_does(served) -> None:
    """The logprob the server reports for a token it generated must equal the score of that token when
    the same text is sent back as a prompt (cached decoding vs one uncached pass)."""
    gen = await served.client.post(
        "/v1/generate",
        json={"prompt": "Hello there", "max_new_tokens": 6, "temperature": 0, "logprobs": True, "ignore_eos": True},
    )
    generated = gen.json()["tokens"]
    prompt_ids = served.engine.generator.tokenizer.encode("Hello there").ids
    ids = prompt_ids + [t["id"] for t in generated]
    r = await served.client.post(
        "/v1/completions", json={**BASE, "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 2}
    )
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing precedes the first
    for want, got in zip(generated, lp["token_logprobs"][len(prompt_ids) :], strict=True):
        assert math.isclose(want["logprob"], got, abs_tol=1e-3), (want, got)
    # Greedy tokens are the most likely ones: each is its position's best top_logprob.
    n_prompt = len(prompt_ids)
    for token_lp, top in zip(lp["token_logprobs"][n_prompt:], lp["top_logprobs"][n_prompt:], strict=True):
        assert len(top) == 2 and math.isclose(max(top.values()), token_lp, abs_tol=1e-6)
    assert choice["text"] == served.engine.generator.tokenizer.decode(ids) and choice["finish_reason"] == "length"
    assert r.json()["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


async def test_lm_eval_style_request(served) -> None:
    """What lm-evaluation-harness sends for loglikelihood: echo, logprobs 1, max_tokens 1, a batch of
    token-id prompts. The prompt's logprobs come first, then the one generated token's."""
    prompts = [[5, 6, 7, 8], [9, 10]]
    req = {**BASE, "prompt": prompts, "max_tokens": 1, "logprobs": 1, "echo": True}
    r = await served.client.post("/v1/completions", json=req)
    assert r.status_code == 200, r.text
    for choice, prompt in zip(r.json()["choices"], prompts, strict=True):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and all(x <= 0 for x in lp["token_logprobs"][1:])
        assert all(isinstance(top, dict) and len(top) == 1 for top in lp["top_logprobs"][1:])
    # The same prompt alone scores the same (batching does not change a row).
    alone = await served.client.post("/v1/completions", json={**req, "prompt": prompts[1]})
    together = r.json()["choices"][1]["logprobs"]["token_logprobs"][1:2]
    assert math.isclose(alone.json()["choices"][0]["logprobs"]["token_logprobs"][1], together[0], abs_tol=1e-4)


async def test_echo_only_stream(served) -> None:
    r = await served.client.post(
        "/v1/completions", json={**BASE, "prompt": "Hello", "max_tokens": 0, "echo": True, "stream": True}
    )
    parsed = chunks(r.content)
    assert parsed[-1] == "[DONE]"
    assert parsed[0]["choices"][0]["text"] == "Hello"
    assert parsed[1]["choices"][0]["finish_reason"] == "length"


async def test_max_tokens_zero_needs_echo(served) -> None:
    r = await served.client.post("/v1/completions", json={**BASE, "prompt": "Hello", "max_tokens": 0})
    assert r.status_code == 422 and "echo" in r.json()["error"]["message"]


async def test_max_tokens_beyond_the_context_is_clamped(serving) -> None:
    async with serving(max_new_tokens=256) as s:
        room = s.engine.generator.artifact.max_positions - 100
        req = {**BASE, "prompt": [5] * 100, "max_tokens": 256, "ignore_eos": True}
        r = await s.client.post("/v1/completions", json=req)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == room
        gen = await s.client.post(
            "/v1/generate", json={"prompt": [5] * 100, "max_new_tokens": 256, "ignore_eos": True}
        )
        assert gen.json()["usage"]["completion_tokens"] == room and gen.json()["finish_reason"] == "length"
    async with serving(max_new_tokens=256, strict_max_tokens=True) as s:
        r = await s.client.post("/v1/completions", json=req)
        assert r.status_code == 422 and "context" in r.json()["error"]["message"]


async def test_tokenizer_routes(served) -> None:
    tok = await served.client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})
    body = tok.json()
    assert tok.status_code == 200 and body["tokens"] == served.engine.generator.tokenizer.encode("Hello world").ids
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"])
    assert body["max_model_len"] == served.engine.generator.artifact.max_positions
    back = await served.client.post("/detokenize", json={"tokens": body["tokens"]})
    assert back.json() == {"prompt": "Hello world"}
    info = (await served.client.get("/tokenizer_info")).json()
    eos = served.engine.generator.artifact.special_tokens["eos"]
    assert info["eos_token"] == served.engine.generator.tokenizer.id_to_token(eos)
    # lm-eval's remote tokenizer finds the eos id by tokenizing the eos text.
    eos_ids = (await served.client.post("/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}))
    assert eos_ids.json()["tokens"] == [eos]
    classifier = await served.client.post("/tokenize", json={"model": "classifier", "prompt": "Hello"})
    cls = served.engine.classifier.tokenizer.encode("Hello").ids
    assert classifier.json()["tokens"] == cls
    missing = await served.client.post("/tokenize", json={"model": "gpt-4", "prompt": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "model"
    bad = await served.client.post("/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "tokens"


async def test_retrieve_one_model(served) -> None:
    r = await served.client.get("/v1/models/generator")
    assert r.status_code == 200 and r.json()["id"] == "generator" and r.json()["object"] == "model"
    missing = await served.client.get("/v1/models/gpt-4")
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
