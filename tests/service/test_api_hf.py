"""TGI's /generate, /generate_stream and /info; POST / and /models/{name} by the model's task, in the
Hugging Face Inference API's `{"inputs", "parameters"}` shapes; an embedding model's feature-extraction and
sentence-similarity, and the 422 for a request shaped for a task the model does not serve."""

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.settings import Settings
from tests.service.conftest import Served, serve


def tgi_events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in body.decode().split("\n") if line.startswith("data:")]


async def test_generate_matches_our_generate(served) -> None:
    params = {"max_new_tokens": 5, "details": True, "decoder_input_details": True, "seed": 3, "do_sample": True}
    r = await served.client.post("/generate", json={"inputs": "Hello", "parameters": params})
    assert r.status_code == 200, r.text
    body = r.json()
    ours = await served.client.post(
        "/v1/generate", json={"prompt": "Hello", "max_new_tokens": 5, "seed": 3, "logprobs": True}
    )
    assert body["generated_text"] == ours.json()["text"]
    details = body["details"]
    assert details["finish_reason"] in ("length", "eos_token", "stop_sequence") and details["seed"] == 3
    assert details["generated_tokens"] == len(details["tokens"]) == ours.json()["usage"]["completion_tokens"]
    assert [t["id"] for t in details["tokens"]] == [t["id"] for t in ours.json()["tokens"]]
    prompt_ids = served.engine.generator.tokenizer.encode("Hello").ids
    assert [t["id"] for t in details["prefill"]] == prompt_ids and details["prefill"][0]["logprob"] is None


async def test_greedy_by_default_and_unknown_parameters_ignored(served) -> None:
    req = {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "some_future_flag": True}}
    a = (await served.client.post("/generate", json=req)).json()["generated_text"]
    b = (await served.client.post("/generate", json=req)).json()["generated_text"]
    greedy = await served.client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 4, "temperature": 0})
    assert a == b == greedy.json()["text"]


async def test_unsupported_parameters_are_422(served) -> None:
    for bad in ({"grammar": {"type": "json", "value": {}}}, {"watermark": True}, {"best_of": 2}, {"top_p": 0}):
        r = await served.client.post("/generate", json={"inputs": "Hello", "parameters": bad})
        assert r.status_code == 422, bad
        assert r.json()["error"]["field"].startswith("parameters.")


async def test_generate_stream(served) -> None:
    req = {"inputs": "Hello", "parameters": {"max_new_tokens": 6, "decoder_input_details": False}}
    r = await served.client.post("/generate_stream", json=req)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = tgi_events(r.content)
    assert events and all(set(e) >= {"index", "token", "generated_text", "details"} for e in events)
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    last = events[-1]
    assert last["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert last["details"]["generated_tokens"] == len(events)
    whole = (await served.client.post("/generate", json=req)).json()["generated_text"]
    assert last["generated_text"] == whole


async def test_root_dispatches_by_task(served) -> None:
    r = await served.client.post("/", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200 and isinstance(r.json(), list) and "generated_text" in r.json()[0]
    stream = await served.client.post("/", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3},
                                                 "stream": True})
    assert tgi_events(stream.content)[-1]["generated_text"] == r.json()[0]["generated_text"]

    labels = served.engine.classifier.artifact.labels
    c = await served.client.post("/models/classifier", json={"inputs": "What a film"})
    assert c.status_code == 200
    (ranked,) = c.json()
    assert sorted(x["label"] for x in ranked) == sorted(labels)
    assert [x["score"] for x in ranked] == sorted((x["score"] for x in ranked), reverse=True)
    ours = (await served.client.post("/v1/classify", json={"text": "What a film"})).json()["results"][0]
    assert ranked[0] == {"label": ours["label"], "score": ours["score"]}
    top1 = await served.client.post("/models/classifier", json={"inputs": ["a", "b"], "parameters": {"top_k": 1}})
    assert [len(x) for x in top1.json()] == [1, 1]
    pair = await served.client.post("/models/classifier", json={"inputs": {"text": "a", "text_pair": "b"}})
    assert pair.status_code == 200

    t = await served.client.post("/models/translator", json={"inputs": "Hello", "parameters": {"src_lang": "en"}})
    ours_t = await served.client.post("/v1/translate", json={"text": "Hello"})
    assert t.json() == [{"translation_text": ours_t.json()["translations"][0]["text"]}]
    wrong_lang = await served.client.post("/models/translator", json={"inputs": "Hi", "parameters": {"tgt_lang": "de"}})
    assert wrong_lang.status_code == 422 and wrong_lang.json()["error"]["field"] == "parameters.tgt_lang"

    missing = await served.client.post("/models/nope", json={"inputs": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "name"
    bad = await served.client.post("/models/classifier", json={"inputs": ""})
    assert bad.status_code == 422 and bad.json()["error"]["field"].startswith("inputs")


async def test_info_and_health(served) -> None:
    info = (await served.client.get("/info")).json()
    assert info["model_id"] == "generator" and info["model_pipeline_tag"] == "text-generation"
    assert info["max_total_tokens"] == served.engine.generator.artifact.max_positions
    classifier = (await served.client.get("/models/classifier/info")).json()
    assert classifier["model_pipeline_tag"] == "text-classification"
    assert (await served.client.get("/models/translator/health")).status_code == 200
    assert (await served.client.get("/models/nope/info")).status_code == 404


@pytest.fixture
async def encoders(make_settings: Callable[..., Settings], tiny_artifacts_with_encoders: Path) -> AsyncIterator[Served]:
    settings = make_settings(artifacts_dir=tiny_artifacts_with_encoders, models=["embedder", "reranker", "classifier"])
    async with serve(settings) as s:
        yield s


async def test_feature_extraction_answers_pooled_vectors(encoders: Served) -> None:
    texts = ["the cat sat on the mat", "a dog ran"]
    tei = (await encoders.client.post("/embed", json={"inputs": texts})).json()
    one = await encoders.client.post("/models/embedder", json={"inputs": texts[0]})
    assert one.status_code == 200, one.text
    np.testing.assert_allclose(one.json(), tei[0], atol=1e-6)  # a text: one vector, as for sentence-transformers
    many = await encoders.client.post("/models/embedder", json={"inputs": texts})
    np.testing.assert_allclose(many.json(), tei, atol=1e-6)
    raw = (await encoders.client.post("/models/embedder", json={"inputs": texts[0], "normalize": False})).json()
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    older = await encoders.client.post("/models/embedder",
                                       json={"inputs": texts[0], "parameters": {"normalize": False}})
    np.testing.assert_allclose(older.json(), raw, atol=1e-6)
    long = "cat dog " * 80
    refused = await encoders.client.post("/models/embedder", json={"inputs": long})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "inputs"
    cut = await encoders.client.post("/models/embedder", json={"inputs": long, "truncate": True,
                                                              "truncation_direction": "left"})  # fmt: skip
    assert cut.status_code == 200 and len(cut.json()) == 32
    explicit = await encoders.client.post("/models/embedder/pipeline/feature-extraction", json={"inputs": texts})
    np.testing.assert_allclose(explicit.json(), tei, atol=1e-6)


async def test_sentence_similarity_is_the_cosine(encoders: Served) -> None:
    source, others = "the cat sat on the mat", ["the cat sat", "stocks fell", "the cat sat on the mat"]
    r = await encoders.client.post("/models/embedder",
                                   json={"inputs": {"source_sentence": source, "sentences": others}})
    assert r.status_code == 200, r.text
    vectors = np.array((await encoders.client.post("/embed", json={"inputs": [source, *others]})).json())
    np.testing.assert_allclose(r.json(), vectors[1:] @ vectors[0], atol=1e-5)
    assert abs(r.json()[2] - 1) < 1e-5
    empty = await encoders.client.post("/models/embedder",
                                       json={"inputs": {"source_sentence": source, "sentences": []}})
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "inputs.sentences"


WRONG_TASKS = [
    # (model, body, the field that tells the task, the task named in the message)
    ("classifier", {"inputs": "hi", "parameters": {"aggregation_strategy": "simple"}},
     "parameters.aggregation_strategy", "token-classification"),
    ("classifier", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {}},
     "inputs.source_sentence", "sentence-similarity"),
    ("classifier", {"inputs": "hi", "normalize": True}, "normalize", "feature-extraction"),
    ("embedder", {"inputs": "hi", "parameters": {}}, "parameters", "another task"),
    ("embedder", {"inputs": "hi", "parameters": {"top_k": 2}}, "parameters.top_k", "another task"),
    ("embedder", {"inputs": "hi", "parameters": {"function_to_apply": "softmax"}},
     "parameters.function_to_apply", "text-classification"),
    ("reranker", {"inputs": "hi", "parameters": {"max_new_tokens": 5}}, "parameters.max_new_tokens", "text-generation"),
]  # fmt: skip


async def test_a_request_for_another_task_is_a_422_naming_the_models_tasks(encoders: Served) -> None:
    for model, body, field, task in WRONG_TASKS:
        r = await encoders.client.post(f"/models/{model}", json=body)
        assert r.status_code == 422, (model, body, r.text)
        error = r.json()["error"]
        assert error["type"] == "unsupported_task" and error["field"] == field, (model, body, error)
        served = "feature-extraction and sentence-similarity" if model == "embedder" else "text-classification"
        assert f"model {model!r} serves {served}, not {task}" in error["message"], error
    for model, task in (("classifier", "token-classification"), ("embedder", "text-classification")):
        r = await encoders.client.post(f"/models/{model}/pipeline/{task}", json={"inputs": "hi"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "task", r.text
        assert task in r.json()["error"]["message"]
    ok = await encoders.client.post("/models/classifier/pipeline/text-classification", json={"inputs": "hi"})
    assert ok.status_code == 200 and ok.json()[0][0]["label"] in ("negative", "positive")


async def test_text_classification_truncates_when_asked(encoders: Served) -> None:
    long = "cat dog " * 300
    refused = await encoders.client.post("/models/classifier", json={"inputs": ["ok", long]})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "inputs[1]"
    for side in ("right", "left"):
        params = {"truncate": True, "truncation_direction": side}
        r = await encoders.client.post("/models/classifier", json={"inputs": ["ok", long], "parameters": params})
        assert r.status_code == 200 and len(r.json()) == 2, r.text


async def test_info_of_an_embedder(encoders: Served) -> None:
    info = (await encoders.client.get("/models/embedder/info")).json()
    assert info["model_pipeline_tag"] == "feature-extraction"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
