"""The embedding routes on the tiny embedder and reranker: OpenAI's POST /v1/embeddings, TEI's POST /embed,
POST /rerank and /info, each in its own request, response and error shape."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.api.native.schemas import MAX_EMBEDDING_INPUTS
from service.api.tei.routes import MAX_CLIENT_BATCH_SIZE
from service.settings import Settings
from tests.service.conftest import Served, serve

ENCODERS = ["embedder", "reranker", "classifier"]
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "stocks fell sharply today", "the cat slept"]
EMBEDDINGS_DOC = Path(__file__).resolve().parents[2] / "docs" / "embeddings.md"
LONG = " ".join(f"word{i % 7} cat dog" for i in range(60))  # well past the tiny embedder's 64 tokens


@pytest.fixture
async def encoders(make_settings: Callable[..., Settings], tiny_artifacts_with_encoders: Path) -> AsyncIterator[Served]:
    async with serve(make_settings(artifacts_dir=tiny_artifacts_with_encoders, models=ENCODERS)) as s:
        yield s


def ids_of(s: Served, text: str) -> list[int]:
    return s.engine.services["embedder"].tokenizer.encode(text).ids


async def embed(s: Served, inputs: object, **options: object) -> list[list[float]]:
    r = await s.client.post("/embed", json={"inputs": inputs, **options})
    assert r.status_code == 200, r.text
    vectors: list[list[float]] = r.json()
    return vectors


def openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# --- OpenAI /v1/embeddings ------------------------------------------------------------------------


async def test_openai_shapes_usage_and_order(encoders: Served) -> None:
    r = await encoders.client.post("/v1/embeddings", json={"input": TEXTS, "model": "embedder"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "embedder"
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 32 for d in body["data"])
    tokens = sum(len(ids_of(encoders, t)) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    vectors = np.array([d["embedding"] for d in body["data"]])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # the model's default: normalised
    np.testing.assert_allclose(vectors, await embed(encoders, TEXTS), atol=1e-6)  # the same vectors as TEI's route
    one = await encoders.client.post("/v1/embeddings", json={"input": TEXTS[2]})  # model omitted: the default
    assert one.json()["model"] == "embedder" and len(one.json()["data"]) == 1
    np.testing.assert_allclose(one.json()["data"][0]["embedding"], vectors[2], atol=1e-6)
    named_default = await encoders.client.post("/v1/embeddings", json={"input": TEXTS[2], "model": "default"})
    assert named_default.json()["data"] == one.json()["data"]


async def test_openai_base64_is_little_endian_float32(encoders: Served) -> None:
    floats = (await encoders.client.post("/v1/embeddings", json={"input": TEXTS[:2]})).json()["data"]
    packed = (await encoders.client.post("/v1/embeddings", json={"input": TEXTS[:2], "encoding_format": "base64"}))
    for f, b in zip(floats, packed.json()["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))


async def test_openai_token_ids_equal_the_text(encoders: Served) -> None:
    texts = await encoders.client.post("/v1/embeddings", json={"input": TEXTS[:2]})
    text_vectors = [d["embedding"] for d in texts.json()["data"]]
    single = await encoders.client.post("/v1/embeddings", json={"input": ids_of(encoders, TEXTS[0])})
    assert single.status_code == 200, single.text
    np.testing.assert_allclose(single.json()["data"][0]["embedding"], text_vectors[0], atol=1e-6)
    lists = await encoders.client.post("/v1/embeddings", json={"input": [ids_of(encoders, t) for t in TEXTS[:2]]})
    np.testing.assert_allclose([d["embedding"] for d in lists.json()["data"]], text_vectors, atol=1e-6)
    assert lists.json()["usage"]["prompt_tokens"] == sum(len(ids_of(encoders, t)) for t in TEXTS[:2])


async def test_openai_dimensions(encoders: Served) -> None:
    full = await encoders.client.post("/v1/embeddings", json={"input": "hi", "dimensions": 32})
    assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == 32
    fewer = await encoders.client.post("/v1/embeddings", json={"input": "hi", "dimensions": 8})
    embedder = encoders.engine.embedder
    assert embedder is not None
    if embedder.artifact.dimensions_truncatable:
        vector = np.array(fewer.json()["data"][0]["embedding"])
        assert len(vector) == 8 and abs(np.linalg.norm(vector) - 1) < 1e-5  # renormalised
    else:
        assert openai_error(fewer, 422)["param"] == "dimensions"
    assert openai_error(await encoders.client.post("/v1/embeddings", json={"input": "hi", "dimensions": 0}), 422)[
        "param"
    ] == "dimensions"


async def test_a_batch_of_32_answers_in_order_as_one_at_a_time(encoders: Served) -> None:
    texts = [f"{TEXTS[i % 4]} number {i} " + "cat " * (i % 9) for i in range(32)]
    batch = (await encoders.client.post("/v1/embeddings", json={"input": texts})).json()["data"]
    assert [d["index"] for d in batch] == list(range(32))
    alone = await asyncio.gather(*(encoders.client.post("/v1/embeddings", json={"input": t}) for t in texts))
    np.testing.assert_allclose(
        [d["embedding"] for d in batch], [r.json()["data"][0]["embedding"] for r in alone], atol=1e-5
    )


BAD_OPENAI = [
    ({"input": ""}, 422, "input"),
    ({"input": []}, 422, "input"),
    ({"input": [[]]}, 422, "input[0]"),
    ({"input": ["fine", ""]}, 422, "input[1]"),
    ({"input": ["fine", "   "]}, 422, "input[1]"),
    ({"input": LONG}, 422, "input"),
    ({"input": ["fine", LONG]}, 422, "input[1]"),
    ({"input": [1, 10**7]}, 422, "input"),
    ({"input": "hi", "encoding_format": "int8"}, 422, "encoding_format"),
    ({"input": "hi", "model": "text-embedding-3-small"}, 404, "model"),
    ({"input": "hi", "model": "classifier"}, 404, "model"),
    ({"inputs": "hi"}, 422, "input"),
]


async def test_openai_errors_name_the_field(encoders: Served) -> None:
    for body, status, param in BAD_OPENAI:
        r = await encoders.client.post("/v1/embeddings", json=body)
        assert openai_error(r, status)["param"] == param, (body, r.text)
    too_long = await encoders.client.post("/v1/embeddings", json={"input": LONG})
    assert "limit is 64" in too_long.json()["error"]["message"]
    wrong = await encoders.client.post("/v1/embeddings", json={"input": "hi", "model": "nope"})
    assert wrong.json()["error"]["code"] == "model_not_found"


async def test_v1_models_lists_the_encoders(encoders: Served) -> None:
    cards = {m["id"]: m for m in (await encoders.client.get("/v1/models")).json()["data"]}
    assert cards["embedder"]["task"] == "embedding" and cards["embedder"]["default"] is True
    assert cards["reranker"]["labels"] == ["score"]


# --- TEI /embed, /rerank, /info ---------------------------------------------------------------------


def tei_error(r: httpx.Response, field: str) -> dict[str, Any]:
    assert r.status_code == 422, r.text
    error: dict[str, Any] = r.json()
    assert error["error_type"] == "Validation" and error["field"] == field, error
    assert field in error["error"]  # the message names the field
    return error


async def test_embed_always_answers_a_list_of_vectors(encoders: Served) -> None:
    (one,) = await embed(encoders, TEXTS[0])
    assert len(one) == 32 and abs(np.linalg.norm(one) - 1) < 1e-5
    raw = (await embed(encoders, TEXTS[0], normalize=False))[0]
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    np.testing.assert_allclose(np.array(raw) / np.linalg.norm(raw), one, atol=1e-6)
    assert len(await embed(encoders, TEXTS)) == len(TEXTS)
    np.testing.assert_allclose((await embed(encoders, ids_of(encoders, TEXTS[0])))[0], one, atol=1e-6)


async def test_embed_truncates_from_either_side(encoders: Served) -> None:
    tei_error(await encoders.client.post("/embed", json={"inputs": LONG}), "inputs")
    tei_error(await encoders.client.post("/embed", json={"inputs": ["ok", LONG]}), "inputs[1]")
    full = ids_of(encoders, LONG)
    embedder = encoders.engine.embedder
    assert embedder is not None
    limit = embedder.max_tokens
    assert len(full) > limit == 64
    content = full[1:-1]  # [CLS] ... [SEP]: truncation keeps the special tokens
    right_ids = [full[0], *content[: limit - 2], full[-1]]
    left_ids = [full[0], *content[-(limit - 2) :], full[-1]]
    right = await embed(encoders, LONG, truncate=True)
    left = await embed(encoders, LONG, truncate=True, truncation_direction="left")
    np.testing.assert_allclose(right, await embed(encoders, right_ids), atol=1e-6)
    np.testing.assert_allclose(left, await embed(encoders, left_ids), atol=1e-6)
    assert not np.allclose(right, left, atol=1e-3)
    assert np.allclose(await embed(encoders, LONG, truncate=True, truncation_direction="Left"), left, atol=1e-6)
    ids_cut = await embed(encoders, full, truncate=True, truncation_direction="left")  # ids are cut as given
    np.testing.assert_allclose(ids_cut, await embed(encoders, full[-limit:]), atol=1e-6)


async def test_embed_errors_in_tei_shape(encoders: Served) -> None:
    tei_error(await encoders.client.post("/embed", json={"inputs": ""}), "inputs")
    tei_error(await encoders.client.post("/embed", json={"inputs": []}), "inputs")
    tei_error(await encoders.client.post("/embed", json={"inputs": ["a", " "]}), "inputs[1]")
    tei_error(await encoders.client.post("/embed", json={"inputs": "a", "prompt_name": "query"}), "prompt_name")
    tei_error(await encoders.client.post("/embed", json={"inputs": "a", "truncation_direction": "up"}),
              "truncation_direction")  # fmt: skip
    bad_json = await encoders.client.post("/embed", content=b"{", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error_type"] == "Validation"


async def test_rerank_orders_by_the_cross_encoder(encoders: Served) -> None:
    query = "where did the cat sit"
    r = await encoders.client.post("/rerank", json={"query": query, "texts": TEXTS})
    assert r.status_code == 200, r.text
    ranks = r.json()
    assert sorted(x["index"] for x in ranks) == list(range(len(TEXTS)))
    assert [x["score"] for x in ranks] == sorted((x["score"] for x in ranks), reverse=True)
    assert all("text" not in x and 0 < x["score"] < 1 for x in ranks)
    pairs = [[query, t] for t in TEXTS]
    classify = await encoders.client.post("/v1/classify", json={"text": pairs, "model": "reranker"})
    by_index = {x["index"]: x["score"] for x in ranks}
    for i, result in enumerate(classify.json()["results"]):
        assert abs(by_index[i] - result["score"]) < 1e-6
        assert abs(result["score"] - 1 / (1 + np.exp(-result["logits"][0]))) < 1e-6
    raw = (await encoders.client.post("/rerank", json={"query": query, "texts": TEXTS, "raw_scores": True})).json()
    assert [x["index"] for x in raw] == [x["index"] for x in ranks]  # the sigmoid keeps the order
    for x in raw:
        assert abs(1 / (1 + np.exp(-x["score"])) - by_index[x["index"]]) < 1e-6
    texts = (await encoders.client.post("/rerank", json={"query": query, "texts": TEXTS, "return_text": True})).json()
    assert all(x["text"] == TEXTS[x["index"]] for x in texts)


async def test_rerank_errors(encoders: Served) -> None:
    tei_error(await encoders.client.post("/rerank", json={"query": "q", "texts": []}), "texts")
    tei_error(await encoders.client.post("/rerank", json={"query": "", "texts": ["a"]}), "query")
    tei_error(await encoders.client.post("/rerank", json={"query": "q", "texts": ["a", LONG]}), "texts[1]")
    cut = await encoders.client.post("/rerank", json={"query": "q", "texts": ["a", LONG], "truncate": True})
    assert cut.status_code == 200 and len(cut.json()) == 2


async def test_the_documented_item_limits_are_the_servers(encoders: Served) -> None:
    """docs/embeddings.md states the inputs one request may hold as SERVE_MAX_QUEUE_SIZE's default and the
    schemas' ceiling; the server takes that many and refuses one more, on each route."""
    doc = EMBEDDINGS_DOC.read_text()
    queue = Settings.model_fields["max_queue_size"].default
    assert encoders.engine.settings.max_queue_size == queue and queue < MAX_EMBEDDING_INPUTS == MAX_CLIENT_BATCH_SIZE
    ceilings = re.findall(r"(?:up to|more than|at most) (\d[\d,]*)", doc)
    assert ceilings and {int(n.replace(",", "")) for n in ceilings} == {MAX_EMBEDDING_INPUTS}, ceilings
    defaults = re.findall(r"`SERVE_MAX_QUEUE_SIZE`[^|(]*\([^|)]*?(\d[\d,]*) by default", doc)
    assert len(defaults) == 4 and {int(n.replace(",", "")) for n in defaults} == {queue}, defaults
    for path, field, body in (("/v1/embeddings", "input", {}), ("/embed", "inputs", {}),
                              ("/rerank", "texts", {"query": "q"})):  # fmt: skip
        r = await encoders.client.post(path, json={**body, field: ["a cat"] * queue})
        assert r.status_code == 200 and len(r.json()["data"] if path == "/v1/embeddings" else r.json()) == queue
        over = await encoders.client.post(path, json={**body, field: ["a cat"] * (queue + 1)})
        assert over.status_code == 422 and f"at most {queue} items" in over.text, (path, over.text)
        ceiling = await encoders.client.post(path, json={**body, field: ["a"] * (MAX_EMBEDDING_INPUTS + 1)})
        assert ceiling.status_code == 422, (path, ceiling.text)


async def test_rerank_without_a_reranker_names_the_classifiers(
    make_settings: Callable[..., Settings], tiny_artifacts_with_encoders: Path
) -> None:
    settings = make_settings(artifacts_dir=tiny_artifacts_with_encoders, models=["embedder", "classifier"])
    async with serve(settings) as s:
        r = await s.client.post("/rerank", json={"query": "q", "texts": ["a"]})
        assert r.status_code == 404 and "'classifier' (2 labels)" in r.json()["error"]
        assert r.json()["error_type"] == "Validation"


async def test_info_adds_tei_fields_to_tgi(encoders: Served) -> None:
    info = (await encoders.client.get("/info")).json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 64 and info["max_client_batch_size"] >= 1
    assert {"model_id", "model_pipeline_tag", "max_total_tokens", "max_input_tokens"} <= set(info)  # TGI's
    reranker = (await encoders.client.get("/models/reranker/info")).json()
    assert reranker["model_type"] == {"reranker": {"id2label": {"0": "score"}, "label2id": {"score": 0}}}
    assert reranker["model_id"] == "reranker" and reranker["model_pipeline_tag"] == "text-classification"
    embedder = (await encoders.client.get("/models/embedder/info")).json()
    assert embedder["model_pipeline_tag"] == "feature-extraction"


async def test_documented_examples_of_the_encoder_routes_succeed(encoders: Served) -> None:
    """The document states the encoder routes of the models served, and each of their examples answers 2xx."""
    document = encoders.app.openapi()
    paths, components = document["paths"], document["components"]["schemas"]
    wanted = ["/v1/embeddings", "/embed", "/rerank", "/models/embedder",
              "/models/embedder/pipeline/feature-extraction", "/models/embedder/pipeline/sentence-similarity",
              "/models/reranker/pipeline/text-classification"]  # fmt: skip
    for path in wanted:
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        example = components[schema["$ref"].rsplit("/", 1)[1]]["examples"][0]
        r = await encoders.client.post(path, json=example)
        assert r.status_code == 200, (path, example, r.text)
    assert "/models/{name}/pipeline/{task}" not in paths


async def test_routes_of_unserved_tasks_are_left_out_of_the_document(served: Served) -> None:
    paths = served.app.openapi()["paths"]
    assert not {"/v1/embeddings", "/embed", "/rerank"} & set(paths)
    assert "/models/classifier/pipeline/text-classification" in paths


async def test_hub_model_list_names_each_pipeline_tag(encoders: Served) -> None:
    listed = {m["id"]: m for m in (await encoders.client.get("/api/models")).json()}
    assert listed["embedder"]["pipeline_tag"] == "feature-extraction"
    assert listed["embedder"]["tags"] == ["feature-extraction", "sentence-similarity"]
    assert listed["reranker"]["pipeline_tag"] == listed["classifier"]["pipeline_tag"] == "text-classification"
    one = await encoders.client.get("/api/models/embedder")
    assert one.json() == listed["embedder"]
    assert (await encoders.client.get("/api/models/nope")).status_code == 404


async def test_top_k_is_documented_per_classifier(encoders: Served) -> None:
    """The reranker has one label, the classifier two: the document's top_k bound follows the model named."""
    import jsonschema

    document = encoders.app.openapi()
    # The body's schema, with the document's components beside it for its $refs.
    schema = {**document["components"]["schemas"]["ClassifyRequest"], "components": document["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    for model, top_k in (("reranker", 2), ("reranker", 1), ("classifier", 2), ("classifier", 3)):
        body = {"text": "good", "model": model, "top_k": top_k}
        documented = not list(validator.iter_errors(body))
        r = await encoders.client.post("/v1/classify", json=body)
        assert documented == (r.status_code == 200), (body, r.text)
