"""The holes an outside probe found (issue 12), each closed: logit_bias keys, auth before the body, docs
and model details behind settings, the attention budget, the OpenAPI constraints, start-up checks of
the artifacts, and streams cut at the drain timeout. tests/reliability runs the same over real sockets."""

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pydantic_core
import pytest

from service.app import cut_off
from service.engine import attention
from service.engine.engine import Engine
from service.engine.tasks.classification.service import ClassifyItem
from service.engine.tasks.generation.decoding import GenerationParams
from service.engine.tasks.translation.decoding import TranslationParams, TranslationSequence
from service.runtime.artifact import ArtifactError
from tests.service.sse_events import events


def error_of(r) -> dict[str, Any]:
    error: dict[str, Any] = r.json()["error"]
    return error


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
        cases: list[tuple[str, dict[str, Any]]] = [
            ("/v1/classify", {"text": ["one two three four five six"] * 3}),
            ("/v1/generate", {"prompt": "one two three", "max_new_tokens": 8}),
            ("/v1/translate", {"text": "one two three", "max_new_tokens": 8}),
        ]
        for path, body in cases:
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


# --- attention maps: what the server holds for them -------------------------------------------------------


@pytest.mark.parametrize(
    "weights",
    [
        np.random.default_rng(0).random((3, 5, 7)).astype(np.float32),
        np.array([[[0.00005, 0.99995, 0.123449, 0.5, 1.0, 0.0]]]),
        np.zeros((2, 0, 0)),
        np.zeros((2, 0, 4)),
        np.array([[[np.nan, 0.5, 1.25, -0.5]]]),  # not weights: the general path, NaN as null
    ],
)
def test_attention_json_is_the_json_of_the_rounded_floats(weights: np.ndarray) -> None:
    expected = pydantic_core.to_json(np.round(weights.astype(np.float64), 4).tolist(), inf_nan_mode="null").decode()
    assert attention.to_json(weights).json == expected


def _own(array: np.ndarray) -> bool:
    """Not a slice of a larger array (a batch's output): the root of its bases is no bigger than it."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.nbytes <= array.nbytes


def _spy(monkeypatch: pytest.MonkeyPatch, session: Any) -> list[tuple[int, list[str]]]:
    """(rows, outputs) of every run of an ORT session."""
    calls: list[tuple[int, list[str]]] = []
    original = session.run

    def run(feeds: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((len(next(iter(feeds.values()))), list(outputs)))
        return original(feeds, outputs, *args, **kwargs)

    monkeypatch.setattr(session, "run", run)
    return calls


def test_only_the_rows_that_ask_fetch_classifier_maps(served, monkeypatch: pytest.MonkeyPatch) -> None:
    clf = served.engine.classifier
    calls = _spy(monkeypatch, clf.model.session)
    items = clf.tokenize(["one", "two three four five six seven", "eight nine"], ["text"] * 3, attention=False)
    items[1] = ClassifyItem(items[1].ids, items[1].type_ids, attention=True)
    results = clf.model.run_batch(items)
    with_maps = [(rows, outputs) for rows, outputs in calls if len(outputs) > 1]
    assert [rows for rows, _ in with_maps] == [1] and sorted(rows for rows, _ in calls) == [1, 2]
    assert [maps is not None for _, maps in results] == [False, True, False]
    n = len(items[1].ids)
    assert results[1][1] is not None and results[1][1][0].shape == (clf.artifact.n_heads, n, n)
    alone = clf.model.run_batch([items[0], items[2]])  # the plain rows' run is theirs alone
    assert np.allclose(results[0][0], alone[0][0]) and np.allclose(results[2][0], alone[1][0])


def test_kept_translation_maps_are_the_asking_rows_own(served, monkeypatch: pytest.MonkeyPatch) -> None:
    tr = served.engine.translator
    calls = _spy(monkeypatch, tr.model.encoder)
    [long_src, short_src] = tr.tokenize(["a much longer source text than the other one", "short"], ["text"] * 2)
    plain = TranslationSequence(long_src, TranslationParams(num_beams=1), 4)
    asking = TranslationSequence(short_src, TranslationParams(num_beams=1, return_attention=True), 4)
    _, batch = tr.model.prefill([plain, asking])
    assert batch is not None and batch.attention is not None
    with_maps = [(rows, outputs) for rows, outputs in calls if any("attention" in o for o in outputs)]
    assert [rows for rows, _ in with_maps] == [1]  # the long source's maps were never fetched
    maps = batch.requests[1].encoder_attention
    assert maps and all(_own(m) for m in maps)  # its own arrays, not views of the batch's output
    batch.step()
    kept = batch.attention[1]
    assert kept is not None and all(_own(block) for rows in kept.cross_attn + kept.self_attn for block in rows)


def test_kept_generation_maps_are_the_asking_rows_own(served) -> None:
    gen = served.engine.generator
    long_ids = gen.tokenize("a much longer prompt than the other one", "prompt")
    short_ids = gen.tokenize("short", "prompt")
    # ignore_eos: a first token drawn as the end token would end the row before the step (sampling is seeded
    # at random).
    long = gen.sequence(long_ids, GenerationParams(max_new_tokens=2, ignore_eos=True))
    asking = gen.sequence(short_ids, GenerationParams(max_new_tokens=2, return_attention=True, ignore_eos=True))
    _, batch = gen.model.prefill([long, asking])
    assert batch is not None
    row = next(r for r in batch.entries if r.params.return_attention)
    assert row.attention and all(_own(block) for blocks in row.attention for block in blocks)
    batch.step()
    assert all(_own(block) for blocks in row.attention for block in blocks)


def test_the_attention_budget_holds_one_request_at_the_limit(make_settings) -> None:
    assert make_settings(max_attention_values=1000, max_attention_values_in_flight=1000).max_attention_values == 1000
    with pytest.raises(ValueError, match="could never be served"):
        make_settings(max_attention_values=1000, max_attention_values_in_flight=999)
