"""Request fields on every protocol: integers of any size are never an overflow 500, top_k beyond
the vocabulary keeps every token, errors name the field as the client sent it and say what is wrong,
a budget beyond the context is clamped, and a missing model is one code everywhere."""

from pathlib import Path
from typing import Any

import pytest

BIG = [2**63, 2**64, 10**30]
GENERATOR = {"model": "generator", "prompt": "hi", "max_tokens": 2}


def read_api_doc() -> str:
    """The text of docs/api.md."""
    return (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def error(r: Any) -> dict[str, Any]:
    """The error as {type, message, field}, from our shape or OpenAI's."""
    body = r.json()["error"]
    if "param" in body:
        return {"type": body["code"], "message": body["message"], "field": body["param"]}
    return dict(body)


def answer(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def bodies(n: int) -> list[tuple[str, dict[str, Any]]]:
    """Every integer field of every protocol, set to `n`."""
    return [
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 2, "top_k": n}),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 2, "temperature": 0, "top_k": n}),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 2, "seed": n}),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": n}),
        ("/v1/generate", {"prompt": [1, n], "max_new_tokens": 2}),
        ("/v1/generate", {"prompt": "hi", "logprobs": True, "top_logprobs": n}),
        ("/v1/completions", {**GENERATOR, "top_k": n}),
        ("/v1/completions", {**GENERATOR, "seed": n}),
        ("/v1/completions", {**GENERATOR, "n": n}),
        ("/v1/completions", {**GENERATOR, "best_of": n}),
        ("/v1/completions", {**GENERATOR, "logprobs": n}),
        ("/v1/completions", {**GENERATOR, "max_tokens": n}),
        ("/v1/completions", {**GENERATOR, "prompt": [n]}),
        ("/v1/completions", {**GENERATOR, "prompt": [[1], [1, n]]}),
        ("/v1/completions", {**GENERATOR, "logit_bias": {str(n): 1}}),
        ("/v1/completions", {**GENERATOR, "logit_bias": {"999999999": 1}}),
        ("/v1/translate", {"text": "hi", "num_beams": 1, "do_sample": True, "top_k": n}),
        ("/v1/translate", {"text": "hi", "num_beams": 1, "do_sample": True, "seed": n}),
        ("/v1/translate", {"text": "hi", "max_new_tokens": n}),
        ("/v1/translate", {"text": "hi", "num_beams": n}),
        ("/v1/translate", {"text": "hi", "n_best": n}),
        ("/v1/translate", {"text": "hi", "no_repeat_ngram_size": n}),
        ("/v1/classify", {"text": "hi", "top_k": n}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_k": n}}),
        ("/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_k": n}}),
        ("/models/generator", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_k": n}}),
        ("/", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_k": n}}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "seed": n}}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": n}}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "truncate": n}}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_n_tokens": n}}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "best_of": n}}),
        ("/models/classifier", {"inputs": "hi", "parameters": {"top_k": n}}),
        ("/models/translator", {"inputs": "hi", "parameters": {"generate_parameters": {"max_new_tokens": n}}}),
        ("/models/translator", {"inputs": "hi", "parameters": {"generate_parameters": {"num_beams": n}}}),
        ("/detokenize", {"tokens": [n]}),
    ]


async def test_integers_of_any_size_are_never_a_500(served) -> None:
    """A 4xx, or a 200 where the size means something (TGI's truncate: keep the whole prompt)."""
    for n in BIG:
        for path, body in bodies(n):
            r = await served.client.post(path, json=body)
            assert r.status_code < 500, (path, body, r.status_code, r.text)
    for path, body in bodies(2**63)[:2]:  # top_k is bounded by the schema, so no model run sees it
        r = await served.client.post(path, json=body)
        assert error(r)["field"] == "top_k" and "2147483647" in error(r)["message"], r.text


async def test_top_k_beyond_the_vocabulary_keeps_every_token(served) -> None:
    for path, body in [
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 8, "seed": 5}),
        ("/v1/completions", {**GENERATOR, "max_tokens": 8, "seed": 5}),
        ("/v1/translate", {"text": "hi there", "num_beams": 1, "do_sample": True, "seed": 5}),
    ]:
        off = await served.client.post(path, json={**body, "top_k": 0})
        largest = await served.client.post(path, json={**body, "top_k": 2**31 - 1})
        assert off.status_code == largest.status_code == 200, largest.text
        assert answer(off.json()) == answer(largest.json()), path


async def test_engine_errors_name_the_field_as_sent(serving) -> None:
    """The engine's option is max_new_tokens; each protocol's client sent its own name for it."""
    async with serving(max_new_tokens=8) as s:
        for path, body, field in [
            ("/v1/completions", {**GENERATOR, "max_tokens": 20}, "max_tokens"),
            ("/v1/generate", {"prompt": "hi", "max_new_tokens": 20}, "max_new_tokens"),
            ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 20}}, "parameters.max_new_tokens"),
            ("/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 20}}, "parameters.max_new_tokens"),
            ("/models/generator", {"inputs": "hi", "parameters": {"max_new_tokens": 20}}, "parameters.max_new_tokens"),
            (
                "/models/translator",
                {"inputs": "hi", "parameters": {"generate_parameters": {"max_new_tokens": 20}}},
                "parameters.generate_parameters.max_new_tokens",
            ),
            (
                "/models/translator",
                {"inputs": "hi", "parameters": {"generate_parameters": {"num_beams": 99}}},
                "parameters.generate_parameters.num_beams",
            ),
            ("/v1/translate", {"text": "hi", "max_new_tokens": 20}, "max_new_tokens"),
        ]:
            r = await s.client.post(path, json=body)
            assert r.status_code == 422 and error(r)["field"] == field, (path, r.text)
    async with serving(max_new_tokens=512, strict_max_tokens=True) as s:
        r = await s.client.post("/v1/completions", json={**GENERATOR, "max_tokens": 500})
        assert r.status_code == 422 and error(r)["field"] == "max_tokens" and "context" in error(r)["message"]


async def test_a_budget_beyond_the_context_is_clamped_whatever_the_cap(served) -> None:
    """The server cap (32 here) is below the context (128): a budget beyond the context still means "as
    much as fits", as docs/api.md says; a budget that fits but passes the cap is a 422 naming max_tokens."""
    room = served.engine.generator.artifact.max_positions - 100
    assert room < served.engine.settings.max_new_tokens
    for path, body in [
        ("/v1/completions", {**GENERATOR, "prompt": [5] * 100, "max_tokens": 1000, "ignore_eos": True}),
        ("/v1/generate", {"prompt": [5] * 100, "max_new_tokens": 1000, "ignore_eos": True}),
    ]:
        r = await served.client.post(path, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == room
    r = await served.client.post("/v1/completions", json={**GENERATOR, "max_tokens": 50})
    assert r.status_code == 422 and error(r)["field"] == "max_tokens" and "SERVE_MAX_NEW_TOKENS" in error(r)["message"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/completions", {**GENERATOR, "best_of": 3}, "best_of"),
        ("/v1/completions", {**GENERATOR, "max_tokens": 0}, "max_tokens"),
        ("/v1/generate", {"prompt": "hi", "top_logprobs": 2}, "top_logprobs"),
        ("/v1/translate", {"text": "hi", "num_beams": 2, "n_best": 3}, "n_best"),
        ("/generate", {"inputs": "hi", "parameters": {"best_of": 2}}, "parameters.best_of"),
    ],
)
async def test_cross_field_errors_name_their_field(served, path: str, body: dict[str, Any], field: str) -> None:
    r = await served.client.post(path, json=body)
    assert r.status_code == 422 and error(r)["field"] == field, r.text
    assert error(r)["message"].startswith(f"{field}: ") and "Value error" not in error(r)["message"]


async def test_validation_messages_say_what_is_wrong(served) -> None:
    r = await served.client.post("/v1/completions", json={**GENERATOR, "stop": ["a", "b", "c", "d", "e"]})
    assert error(r) == {"type": "validation_error", "message": "stop: at most 4 items, not 5", "field": "stop"}
    r = await served.client.post("/v1/generate", json={"prompt": "hi", "stop": ["x"] * 17})
    assert error(r)["message"] == "stop: at most 16 items, not 17"
    r = await served.client.post("/v1/completions", json={**GENERATOR, "n": 0, "top_k": -1})
    assert error(r)["message"] == "n: Input should be greater than or equal to 1 (also wrong: top_k)"


async def test_a_missing_model_is_one_code_on_every_route(served) -> None:
    """model_not_loaded (docs/api.md's code) on our routes; OpenAI's model_not_found on its routes."""
    for method, path, body, field in [
        ("post", "/v1/classify", {"text": "hi", "model": "nope"}, "model"),
        ("post", "/v1/generate", {"prompt": "hi", "model": "nope"}, "model"),
        ("post", "/tokenize", {"prompt": "hi", "model": "nope"}, "model"),
        ("post", "/detokenize", {"tokens": [1], "model": "nope"}, "model"),
        ("get", "/tokenizer_info?model=nope", None, "model"),
        ("post", "/models/nope", {"inputs": "hi"}, "name"),
        ("get", "/models/nope/info", None, "name"),
    ]:
        r = await served.client.request(method, path, json=body)
        assert r.status_code == 404 and error(r)["type"] == "model_not_loaded" and error(r)["field"] == field, path
    r = await served.client.post("/v1/completions", json={**GENERATOR, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model"
    api_doc = read_api_doc()
    assert "`model_not_loaded`" in api_doc


async def test_echo_scores_a_prompt_that_fills_the_context(served) -> None:
    positions = served.engine.generator.artifact.max_positions
    body = {**GENERATOR, "prompt": [5] * positions, "echo": True, "max_tokens": 0, "logprobs": 1}
    r = await served.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["token_logprobs"]) == positions
    generating = await served.client.post("/v1/completions", json={**body, "max_tokens": 1})
    assert generating.status_code == 422 and error(generating)["field"] == "prompt"
    too_long = await served.client.post("/v1/completions", json={**body, "prompt": [5] * (positions + 1)})
    assert too_long.status_code == 422 and error(too_long)["field"] == "prompt"
