"""The holes an outside probe found (issue 12), each closed: logit_bias keys, auth before the body, docs
and model details behind settings, the attention budget, the OpenAPI constraints, start-up checks of
the artifacts, and streams cut at the drain timeout. tests/reliability runs the same over real sockets."""

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from service.app import cut_off
from service.engine.engine import Engine
from service.runtime.artifact import ArtifactError
from tests.service.sse_events import events


def error_of(r) -> dict[str, Any]:
    return r.json()["error"]


@pytest.mark.parametrize("key", ["²", "١", "9" * 5000, "-1", " 1", "0x10", ""])
async def test_logit_bias_keys_must_be_ascii_token_ids(served, key: str) -> None:
    body = {"model": "generator", "prompt": "hi", "max_tokens": 2, "logit_bias": {key: 1}}
    r = await served.client.post("/v1/completions", json=body)
    assert r.status_code == 422, r.text
    assert len(r.text) < 2000  # a 5,000-digit key is not echoed back


async def test_logit_bias_ids_outside_the_vocabulary_are_422(served) -> None:
    vocab = served.engine.generator.artifact.vocab_size
    body = {"model": "generator", "prompt": "hi", "max_tokens": 2, "logit_bias": {str(vocab): 1}}
    assert (await served.client.post("/v1/completions", json=body)).status_code == 422
    ok = {"model": "generator", "prompt": "hi", "max_tokens": 2, "logit_bias": {str(vocab - 1): 5}}
    assert (await served.client.post("/v1/completions", json=ok)).status_code == 200


async def test_the_key_is_checked_before_the_body(serving) -> None:
    async with serving(api_key="s3cret", max_body_bytes=2048) as s:
        invalid = await s.client.post(
            "/v1/generate", content=b'{"prompt": ', headers={"content-type": "application/json"}
        )
        assert invalid.status_code == 401, invalid.text
        large = await s.client.post("/v1/classify", content=b"x" * 10_000, headers={"content-type": "application/json"})
        assert large.status_code == 401
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert (await s.client.get(path)).status_code == 401, path
        key = {"Authorization": "Bearer s3cret"}
        assert (await s.client.get("/openapi.json", headers=key)).status_code == 200
        for path in ("/health", "/ready", "/metrics"):
            assert (await s.client.get(path)).status_code == 200, path


async def test_public_docs_setting(serving) -> None:
    async with serving(api_key="s3cret", public_docs=True) as s:
        assert (await s.client.get("/openapi.json")).status_code == 200
        assert (await s.client.post("/v1/classify", json={"text": "hi"})).status_code == 401


async def test_model_details_can_be_hidden(serving) -> None:
    async with serving(model_details=False) as s:
        models = (await s.client.get("/v1/models")).json()["data"]
        assert models and all("card" not in m and "task" in m and "metrics" in m for m in models)
    async with serving() as s:
        assert all("card" in m for m in (await s.client.get("/v1/models")).json()["data"])


async def test_attention_budget_is_a_422_before_any_work(serving) -> None:
    async with serving(max_attention_values=500) as s:
        for path, body in [
            ("/v1/classify", {"text": ["one two three four five six"] * 3}),
            ("/v1/generate", {"prompt": "one two three", "max_new_tokens": 8}),
            ("/v1/translate", {"text": "one two three", "max_new_tokens": 8}),
        ]:
            r = await s.client.post(path, json={**body, "return_attention": True})
            assert r.status_code == 422, (path, r.text)
            assert error_of(r)["field"] == "return_attention" and "SERVE_MAX_ATTENTION_VALUES" in error_of(r)["message"]
    async with serving() as s:
        r = await s.client.post("/v1/classify", json={"text": "one two", "return_attention": True})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json()["results"][0]["attention"]["layers"]


def test_openapi_states_the_rules_the_server_checks(served) -> None:
    schema = served.app.openapi()
    components = schema["components"]["schemas"]
    generate_rules = json.dumps(components["GenerateRequest"]["allOf"])
    assert "top_logprobs" in generate_rules and '"logprobs": {"const": true}' in generate_rules
    translate_rules = json.dumps(components["TranslateRequest"]["allOf"])
    assert '"stream": {"const": true}' in translate_rules and '"num_beams": {"const": 1}' in translate_rules
    top_k = components["ClassifyRequest"]["properties"]["top_k"]
    assert {"type": "integer", "minimum": 1, "maximum": len(served.engine.classifier.labels)} in top_k["anyOf"]
    assert components["CompletionRequest"]["properties"]["model"]["enum"] == [served.engine.generator.name]
    assert "404" in schema["paths"]["/v1/completions"]["post"]["responses"]


async def test_an_internal_error_is_our_json_500(served, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("the request text SECRET")

    monkeypatch.setattr(served.engine.classifier, "tokenize", broken)
    r = await served.client.post("/v1/classify", json={"text": "SECRET"})
    assert r.status_code == 500 and error_of(r)["type"] == "internal_error"
    assert "SECRET" not in r.text


async def _cut_mid_stream(served, call_and_hang_up, path: str, body: dict[str, Any]) -> bytes:
    """A slow stream, with the server cut off once it has started; the whole body as sent."""

    async def cut_soon() -> None:
        await asyncio.sleep(0.3)
        await cut_off(served.app)

    cutter = asyncio.ensure_future(cut_soon())
    sent = await call_and_hang_up(served.app, path, json.dumps(body).encode(), asyncio.Event())
    await cutter
    assert sent[0]["status"] == 200
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_cut_off_ends_streams_with_a_final_error(served, slow_down, call_and_hang_up) -> None:
    slow_down(served.engine.generator.model.session, 0.05)
    body = {"prompt": "hi", "max_new_tokens": 30, "ignore_eos": True, "stream": True}
    name, data = events(await _cut_mid_stream(served, call_and_hang_up, "/v1/generate", body))[-1]
    assert name == "error" and data["error"]["type"] == "unavailable"


async def test_cut_off_ends_openai_streams_with_done(served, slow_down, call_and_hang_up) -> None:
    slow_down(served.engine.generator.model.session, 0.05)
    body = {"model": "generator", "prompt": "hi", "max_tokens": 30, "ignore_eos": True, "stream": True}
    raw = await _cut_mid_stream(served, call_and_hang_up, "/v1/completions", body)
    data = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and "error" in json.loads(data[-2])


def _broken_copy(tiny_artifacts: Path, tmp_path: Path, model: str, **changes: Any) -> Path:
    shutil.copytree(tiny_artifacts / model, tmp_path / model)
    path = tmp_path / model / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        (config["dims"] if key in ("n_heads", "d_head") else config)[key] = value
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "model,changes",
    [
        ("generator", {"vocab_size": 17}),
        ("generator", {"max_positions": 100_000}),
        ("generator", {"n_heads": 3}),
        ("translator", {"d_head": 5}),
        ("classifier", {"vocab_size": 100_000}),
    ],
)
def test_load_refuses_a_config_that_does_not_match_the_graphs(
    make_settings, tiny_artifacts: Path, tmp_path: Path, model: str, changes: dict[str, int]
) -> None:
    config = _broken_copy(tiny_artifacts, tmp_path, model, **changes)
    engine = Engine(make_settings(artifacts_dir=tmp_path, models=model))
    with pytest.raises(ArtifactError) as failed:
        engine.load()
    message = str(failed.value)
    assert message.startswith(str(config)) and "\n" not in message


def test_load_names_a_broken_tokenizer(make_settings, tiny_artifacts: Path, tmp_path: Path) -> None:
    _broken_copy(tiny_artifacts, tmp_path, "classifier")
    (tmp_path / "classifier" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"classifier/tokenizer\.json: cannot load the tokenizer"):
        Engine(make_settings(artifacts_dir=tmp_path, models="classifier")).load()


async def test_streamed_attention_arrives_in_the_done_event(served) -> None:
    body = {"prompt": "one two", "max_new_tokens": 3, "stream": True, "return_attention": True}
    r = await served.client.post("/v1/generate", json=body)
    name, done = events(r.content)[-1]
    assert name == "done" and done["attention"]["layers"]
