"""TGI's /generate, /generate_stream and /info; POST / and /models/{name} by the model's task, in the
Hugging Face Inference API's `{"inputs", "parameters"}` shapes; an embedding model's feature-extraction and
sentence-similarity, and the 422 for a request shaped for a task the model does not serve."""

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient

from service.api.hf.embeddings import FeatureExtractionOptions
from service.api.hf.routes import ClassificationParameters, TranslationParameters
from service.api.hf.tasks import PARAMETERS, served_tasks
from service.api.tgi.schemas import TgiParameters
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
    for bad in ({"grammar": {"type": "xml", "value": ""}}, {"watermark": True}, {"best_of": 2}, {"top_p": 0}):
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
    ("classifier", {"inputs": "hi", "parameters": {"generate_parameters": {}}},
     "parameters.generate_parameters", "summarization or translation"),
    ("embedder", {"inputs": "hi", "parameters": {}}, "parameters", "text-generation, text-classification, "
     "token-classification, fill-mask, summarization, translation or text-to-speech"),
    ("embedder", {"inputs": "hi", "normalize": None, "parameters": {}}, "parameters", "text-generation, "
     "text-classification, token-classification, fill-mask, summarization, translation or text-to-speech"),
    ("embedder", {"inputs": "hi", "parameters": {"future_flag": 1}}, "parameters.future_flag", "text-generation, "
     "text-classification, token-classification, fill-mask, summarization, translation or text-to-speech"),
    ("embedder", {"inputs": "hi", "parameters": {"top_k": 2}}, "parameters.top_k",
     "text-generation, text-classification, fill-mask or question-answering"),
    ("embedder", {"inputs": "hi", "parameters": {"function_to_apply": "softmax"}},
     "parameters.function_to_apply", "text-classification"),
    ("reranker", {"inputs": "hi", "parameters": {"max_new_tokens": 5}}, "parameters.max_new_tokens", "text-generation"),
    ("reranker", {"inputs": "hi", "stream": True}, "stream", "text-generation"),
    ("reranker", {"inputs": {"question": "q", "context": "c"}}, "inputs.question", "question-answering"),
]  # fmt: skip


async def test_a_request_for_another_task_is_a_422_naming_the_models_tasks(encoders: Served) -> None:
    for model, body, field, task in WRONG_TASKS:
        r = await encoders.client.post(f"/models/{model}", json=body)
        assert r.status_code == 422, (model, body, r.text)
        error = r.json()["error"]
        assert error["type"] == "unsupported_task" and error["field"] == field, (model, body, error)
        served = "feature-extraction and sentence-similarity" if model == "embedder" else "text-classification"
        assert f"model {model!r} serves {served}, not {task} (asked by `{field}`" in error["message"], error
    r = await encoders.client.post("/models/reranker", json={"inputs": "hi", "normalize": True})
    assert "feature-extraction at POST /models/embedder" in r.json()["error"]["message"]  # where it is served
    for model, task in (("classifier", "token-classification"), ("embedder", "text-classification")):
        r = await encoders.client.post(f"/models/{model}/pipeline/{task}", json={"inputs": "hi"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "task", r.text
        assert task in r.json()["error"]["message"]
    ok = await encoders.client.post("/models/classifier/pipeline/text-classification", json={"inputs": "hi"})
    assert ok.status_code == 200 and ok.json()[0][0]["label"] in ("negative", "positive")
    similarity = {"inputs": {"source_sentence": "a", "sentences": ["b"]}}
    named = await encoders.client.post("/models/embedder/pipeline/feature-extraction", json=similarity)
    assert named.status_code == 422 and named.json()["error"]["field"] == "inputs.source_sentence", named.text


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


# --- every text task of huggingface_hub's InferenceClient, as it sends it, at every dispatch URL ----------

TEXT = "The cat sat on the mat."
# (task, what the call sets, the call): each text task at its defaults and, where it has one, with a
# parameter of its own. The bodies are the client's own (captured below), not written here.
CLIENT_CALLS: list[tuple[str, str, Callable[[InferenceClient], Any]]] = [
    ("text-generation", "defaults", lambda c: c.text_generation(TEXT)),
    ("text-generation", "max_new_tokens", lambda c: c.text_generation(TEXT, max_new_tokens=2)),
    ("text-generation", "stream", lambda c: list(c.text_generation(TEXT, max_new_tokens=2, stream=True))),
    ("text-generation", "top_k", lambda c: c.text_generation(TEXT, top_k=1)),
    ("text-classification", "defaults", lambda c: c.text_classification(TEXT)),
    ("text-classification", "top_k", lambda c: c.text_classification(TEXT, top_k=1)),
    ("text-classification", "function_to_apply", lambda c: c.text_classification(TEXT, function_to_apply="softmax")),
    ("token-classification", "defaults", lambda c: c.token_classification(TEXT)),
    ("token-classification", "aggregation_strategy",
     lambda c: c.token_classification(TEXT, aggregation_strategy="simple")),
    ("fill-mask", "defaults", lambda c: c.fill_mask(TEXT)),
    ("fill-mask", "targets", lambda c: c.fill_mask(TEXT, targets=["dog"])),
    ("fill-mask", "top_k", lambda c: c.fill_mask(TEXT, top_k=1)),
    ("summarization", "defaults", lambda c: c.summarization(TEXT)),
    ("summarization", "generate_parameters", lambda c: c.summarization(TEXT, generate_parameters={"num_beams": 1})),
    ("translation", "defaults", lambda c: c.translation(TEXT)),
    ("translation", "src_lang", lambda c: c.translation(TEXT, src_lang="en", tgt_lang="fr")),
    ("translation", "generate_parameters", lambda c: c.translation(TEXT, generate_parameters={"num_beams": 1})),
    ("feature-extraction", "defaults", lambda c: c.feature_extraction(TEXT)),
    ("feature-extraction", "normalize", lambda c: c.feature_extraction(TEXT, normalize=True)),
    ("sentence-similarity", "defaults", lambda c: c.sentence_similarity(TEXT, other_sentences=["A dog ran."])),
    ("question-answering", "defaults", lambda c: c.question_answering(question="Who sat?", context=TEXT)),
    ("zero-shot-classification", "defaults", lambda c: c.zero_shot_classification(TEXT, candidate_labels=["a", "b"])),
    ("table-question-answering", "defaults", lambda c: c.table_question_answering({"a": ["1"]}, query="a?")),
    ("text-to-speech", "defaults", lambda c: c.text_to_speech(TEXT)),
    ("text-to-image", "defaults", lambda c: c.text_to_image(TEXT)),
]  # fmt: skip


class _Sent(Exception):
    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request


class _Session:
    def stream(self, method: str, url: str, **request: Any) -> None:
        raise _Sent(request)


def client_request(call: Callable[[InferenceClient], Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The JSON body and the headers huggingface_hub's InferenceClient sends for `call` (stopped before it
    leaves)."""
    with mock.patch("huggingface_hub.inference._client.get_session", _Session):
        try:
            call(InferenceClient(model="http://server.invalid"))
        except _Sent as sent:
            return sent.request["json"], {k.lower(): v for k, v in sent.request["headers"].items()}
    raise AssertionError("the client sent nothing")


def sent(call: Callable[[InferenceClient], Any]) -> tuple[dict[str, Any], str]:
    """The body and the Accept header of `call`'s request (httpx's default where the client sets none)."""
    body, headers = client_request(call)
    return body, headers.get("accept", "*/*")


def own_requests(served: tuple[str, ...]) -> list[tuple[dict[str, Any], str]]:
    """Every request the client sends for the tasks in `served`, and the Inference API's bare
    `{"inputs": text}`: what a model's URL must answer in its own task."""
    return [sent(call) for task, _, call in CLIENT_CALLS if task in served] + [({"inputs": TEXT}, "*/*")]


def answer_tasks(r: httpx.Response) -> set[str]:
    """The tasks whose shape a 200 has (a list of numbers: a vector, or similarities)."""
    if r.headers["content-type"].startswith("text/event-stream"):
        return {"text-generation"} if "generated_text" in tgi_events(r.content)[-1] else set()
    body = r.json()
    first = body[0] if isinstance(body, list) and body else None
    if isinstance(first, dict):
        return {task for key, task in (("generated_text", "text-generation"), ("translation_text", "translation"))
                if set(first) == {key}}  # fmt: skip
    if isinstance(first, list):
        return {"text-classification"} if all({"label", "score"} == set(x) for x in first) else set()
    return {"feature-extraction", "sentence-similarity"} if all(isinstance(x, float) for x in body) else set()


@pytest.fixture
async def every_task(
    make_settings: Callable[..., Settings], tiny_artifacts_with_encoders: Path
) -> AsyncIterator[Served]:
    settings = make_settings(artifacts_dir=tiny_artifacts_with_encoders,
                             models=["generator", "translator", "classifier", "embedder"])  # fmt: skip
    async with serve(settings) as s:
        yield s


async def test_every_client_task_gets_its_own_answer_or_a_4xx_at_every_url(every_task: Served) -> None:
    """POST /, each /models/<name> and each /models/<name>/pipeline/<task>: every text task of the client gets
    a 4xx naming what told, or an answer from a model of its task. The one exception: a model's URL given a
    body the client sends alike for the model's own task (no byte tells them apart), answered in that task."""
    urls = {"/": served_tasks(every_task.engine.resolve(None).artifact.task)}
    for name, service in every_task.engine.served().items():
        urls[f"/models/{name}"] = served_tasks(service.artifact.task)
        urls |= {f"/models/{name}/pipeline/{task}": (task,) for task in served_tasks(service.artifact.task)}
    requests = [(task, what, *sent(call)) for task, what, call in CLIENT_CALLS]
    alike = set()
    for url, served in urls.items():
        own = own_requests(served) if url != "/" else []
        for task, what, body, accept in requests:
            r = await every_task.client.post(url, json=body, headers={"accept": accept})
            where = (url, task, what, r.text[:300])
            if r.status_code == 200:
                assert answer_tasks(r) & set(served), where
                if task not in served:
                    assert url != "/" and (body, accept) in own, where
                    alike.add((task, what))
                continue
            assert r.status_code in (406, 422), where
            kind = r.json()["error"]["type"]
            assert kind in ("unsupported_task", "ambiguous_task", "not_acceptable") or (body, accept) in own, where
            assert task not in served or (url == "/" and kind == "ambiguous_task"), where
    # What the bytes cannot tell: the tasks' defaults (`parameters: {}`, or none), and a top_k or a
    # generate_parameters that other tasks take too.
    assert {what for _, what in alike} == {"defaults", "top_k", "generate_parameters"}, alike
    assert ("token-classification", "aggregation_strategy") not in alike and ("fill-mask", "targets") not in alike


async def test_the_root_answers_a_body_that_names_its_task(every_task: Served) -> None:
    bare, _ = client_request(CLIENT_CALLS[0][2])  # text_generation(TEXT): `parameters: {}`
    r = await every_task.client.post("/", json=bare)
    error = r.json()["error"]
    assert r.status_code == 422 and error["type"] == "ambiguous_task" and error["field"] == "parameters", r.text
    for url in ("text-generation at POST /models/generator", "text-classification at POST /models/classifier",
                "translation at POST /models/translator", "max_new_tokens"):
        assert url in error["message"], error
    no_parameters = await every_task.client.post("/", json={"inputs": TEXT})
    assert no_parameters.status_code == 422 and no_parameters.json()["error"]["field"] == "inputs"
    assert "feature_extraction" in no_parameters.json()["error"]["message"]
    normalize = await every_task.client.post("/", json={"inputs": TEXT, "normalize": True})
    error = normalize.json()["error"]
    assert error["type"] == "unsupported_task" and "feature-extraction at POST /models/embedder" in error["message"]
    named = await every_task.client.post("/", json={**bare, "parameters": {"max_new_tokens": 2}})
    assert named.status_code == 200 and answer_tasks(named) == {"text-generation"}
    streamed = await every_task.client.post("/", json={**bare, "stream": True})
    assert streamed.status_code == 200 and answer_tasks(streamed) == {"text-generation"}


async def test_an_accept_of_neither_json_nor_events_is_a_406(every_task: Served) -> None:
    for accept, named in (("image/png", "text-to-image"), ("audio/wav, audio/*", "text-to-speech"), ("text/html", "")):
        r = await every_task.client.post("/models/classifier", json={"inputs": TEXT}, headers={"accept": accept})
        error = r.json()["error"]
        assert r.status_code == 406 and error["type"] == "not_acceptable" and error["field"] == "Accept", r.text
        assert named in error["message"]
    for accept in ("application/json", "*/*", "text/event-stream", "application/json;q=0.9, image/png"):
        r = await every_task.client.post("/models/classifier", json={"inputs": TEXT}, headers={"accept": accept})
        assert r.status_code == 200, (accept, r.text)


def test_the_task_table_holds_every_parameter_this_server_takes() -> None:
    """A parameter our schemas add is one hf_tasks knows, else a body using it would read as naming no task."""
    for task, schema in (("text-generation", TgiParameters), ("text-classification", ClassificationParameters),
                         ("translation", TranslationParameters), ("feature-extraction", FeatureExtractionOptions)):
        assert set(schema.model_fields) <= PARAMETERS[task], task
