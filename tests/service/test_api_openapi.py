"""The OpenAPI document and the server agree: what the document calls valid the server takes, what it
calls invalid the server refuses (at each limit and just past it), every example succeeds as shown, and
every route that answers is documented. schemathesis checks the same over generated data
(harness/reliability/contract.py); these are the cases it found, pinned."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from jsonschema_rs import canonical

from contract.cards import no_use_summary, use_summary
from contract.kinds import TASKS
from service.api.docs.openapi_limits import decimal_at_most
from service.api.native.schemas import MAX_SEED, NOT_BLANK
from service.engine.registry import records
from service.engine.tokens.sampling import new_seed
from tests.conftest import REAL_ARTIFACTS

JS_SAFE = 2**53 - 1  # Number.MAX_SAFE_INTEGER: a bound above it is shown and sent rounded by /docs


def properties_named(name: str, node: Any) -> Any:
    """Every property schema called `name` in the document."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict) and name in node["properties"]:
            yield node["properties"][name]
        for value in node.values():
            yield from properties_named(name, value)
    elif isinstance(node, list):
        for value in node:
            yield from properties_named(name, value)


def _integer(prop: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in prop.get("anyOf", [prop]) if m.get("type") == "integer")


def request_schema(document: dict[str, Any], path: str) -> Any:
    """A validator for the JSON body of POST `path`, its $refs resolved within the document."""
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema_rs.validator_for({**body, "components": document["components"]})


async def agree(served: Any, path: str, body: Any) -> tuple[bool, int]:
    """(valid per the document, the server's status); they agree when valid <=> a 2xx."""
    valid = request_schema(served.app.openapi(), path).is_valid(body)
    status = (await served.client.post(path, json=body)).status_code
    assert status < 500, (path, body, status)
    return valid, status


async def assert_agree(served: Any, cases: list[tuple[str, Any]]) -> None:
    disagreements = []
    for path, body in cases:
        valid, status = await agree(served, path, body)
        if valid != (status < 400):
            disagreements.append((path, body, "valid" if valid else "invalid", status))
    assert not disagreements, disagreements


async def test_integral_floats_are_integers(served) -> None:
    """JSON Schema calls 1.0 an integer (schemathesis ST202 sent it); "1", true and 1.5 are not."""
    vocab = served.engine.generator.artifact.vocab_size
    await assert_agree(served, [
        ("/v1/classify", {"text": "good", "top_k": 1.0}),
        ("/v1/classify", {"text": "good", "top_k": 1.5}),
        ("/v1/classify", {"text": "good", "top_k": "1"}),
        ("/v1/classify", {"text": "good", "top_k": True}),
        ("/v1/translate", {"text": "hi", "num_beams": 2.0, "n_best": 2.0, "max_new_tokens": 4.0}),
        ("/v1/generate", {"prompt": [1.0, 2.0], "max_new_tokens": 2, "seed": 3.0}),
        ("/v1/completions", {"model": "generator", "prompt": [[1.0, 2.0]], "max_tokens": 2.0, "n": 1.0}),
        ("/detokenize", {"tokens": [1.0, float(vocab - 1)]}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2.0, "top_k": 5.0}}),
    ])  # fmt: skip


def test_seeds_are_exact_in_javascript(served) -> None:
    """/docs showed the seed's maximum 2**63 - 1 as 9223372036854776000 and refused it when sent; a seed
    the server draws is reported back, so it too must be one a client can send again."""
    components = served.app.openapi()["components"]["schemas"]
    requests = {name: c for name, c in components.items() if not name.endswith("Response")}
    seeds = list(properties_named("seed", requests))
    assert len(seeds) == 5 and all(_integer(s)["maximum"] == JS_SAFE for s in seeds), seeds  # chat's too
    assert MAX_SEED == JS_SAFE
    assert max(new_seed() for _ in range(2000)) <= MAX_SEED


async def test_seed_bounds(served) -> None:
    await assert_agree(served, [
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 2, "seed": MAX_SEED}),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 2, "seed": MAX_SEED + 1}),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "seed": MAX_SEED, "do_sample": True}}),
    ])  # fmt: skip


async def test_rules_between_fields(served) -> None:
    """The checks the server makes across fields, each stated in the document."""
    await assert_agree(served, [
        ("/v1/translate", {"text": "hi", "num_beams": 2, "n_best": 2}),
        ("/v1/translate", {"text": "hi", "num_beams": 2, "n_best": 3}),
        ("/v1/translate", {"text": "hi", "n_best": 5}),  # num_beams 4 when absent
        ("/v1/translate", {"text": "hi", "repetition_penalty": 1.2}),
        ("/v1/translate", {"text": "hi", "repetition_penalty": 1.2, "num_beams": 1, "max_new_tokens": 4}),
        ("/v1/translate", {"text": "hi", "stop": "x"}),
        ("/v1/translate", {"text": "hi", "stop": []}),
        ("/v1/translate", {"text": ["a", "b"], "stream": True, "num_beams": 1}),
        ("/v1/completions", {"model": "generator", "prompt": "hi", "max_tokens": 2, "best_of": 2}),
        ("/v1/completions", {"model": "generator", "prompt": "hi", "max_tokens": 2, "best_of": 2, "n": 2}),
        ("/v1/completions", {"model": "generator", "prompt": "hi", "max_tokens": 0}),
        ("/v1/completions", {"model": "generator", "prompt": "hi", "max_tokens": 0, "echo": True}),
    ])  # fmt: skip


async def test_blank_texts(served) -> None:
    """A text of whitespace alone is refused (the engine strips it): the document says so with a pattern
    matching Python's whitespace exactly, \\x1f and \\x85 included (schemathesis sent both)."""
    pattern = re.compile(NOT_BLANK)
    assert [c for c in range(sys.maxunicode + 1) if (pattern.search(chr(c)) is None) != chr(c).isspace()] == []
    await assert_agree(served, [
        ("/v1/classify", {"text": ["fine", "\x1f"]}),
        ("/v1/classify", {"text": [["fine", "\x85 "]]}),
        ("/v1/translate", {"text": " \u3000", "max_new_tokens": 2}),
        ("/models/classifier", {"inputs": {"text": "a", "text_pair": "\t"}}),
        ("/v1/classify", {"text": " a "}),
    ])  # fmt: skip


async def test_limits_from_settings_and_models(serving) -> None:
    """Beams are batch rows, requests queue at most SERVE_MAX_QUEUE_SIZE items (prompts x n), token ids
    are below the vocabulary, prompts of ids within the context, new tokens within the cap."""
    async with serving(max_batch_size=3, max_queue_size=8, max_new_tokens=16) as s:
        generator = s.engine.generator
        vocab, most = generator.artifact.vocab_size, generator.max_prompt_tokens
        assert generator.artifact.max_positions - 1 > 16  # the cap is reachable: above it is refused
        completion = {"model": "generator", "max_tokens": 2}
        await assert_agree(s, [
            ("/v1/translate", {"text": "hi", "num_beams": 3, "max_new_tokens": 2}),
            ("/v1/translate", {"text": "hi", "num_beams": 4, "n_best": 1, "max_new_tokens": 2}),
            ("/models/translator", {"inputs": "hi", "parameters": {"generate_parameters": {"num_beams": 4}}}),
            ("/models/translator", {"inputs": "hi", "parameters": {"generate_parameters": {"max_new_tokens": 0}}}),
            ("/v1/classify", {"text": ["a"] * 8}),
            ("/v1/classify", {"text": ["a"] * 9}),
            ("/v1/completions", {**completion, "prompt": ["a", "b"], "n": 4}),
            ("/v1/completions", {**completion, "prompt": ["a", "b", "c"], "n": 3}),
            ("/v1/completions", {**completion, "prompt": [vocab - 1]}),
            ("/v1/completions", {**completion, "prompt": [[1], [vocab]]}),
            ("/v1/completions", {**completion, "prompt": "hi", "logit_bias": {str(vocab - 1): 1, "007": 2}}),
            ("/v1/completions", {**completion, "prompt": "hi", "logit_bias": {str(vocab): 1}}),
            ("/v1/generate", {"prompt": [1] * most, "max_new_tokens": 1}),
            ("/v1/generate", {"prompt": [1] * (most + 1), "max_new_tokens": 1}),
            ("/v1/generate", {"prompt": "hi", "max_new_tokens": 16}),
            ("/detokenize", {"tokens": [vocab - 1]}),
            ("/detokenize", {"tokens": [vocab]}),
        ])  # fmt: skip
        # A budget past SERVE_MAX_NEW_TOKENS is refused where the context has room for it after the prompt, and
        # clamped where it has not: it depends on the prompt's tokens, so the document states no maximum and
        # the 422 names the setting (the reliability suite counts it as a token-dependent refusal).
        for path, body in (("/v1/generate", {"prompt": "hi", "max_new_tokens": 17}),
                           ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 17}})):
            assert request_schema(s.app.openapi(), path).is_valid(body)
            r = await s.client.post(path, json=body)
            assert r.status_code == 422 and "(SERVE_MAX_NEW_TOKENS)" in r.text, r.text


@pytest.mark.parametrize("top", [0, 1, 9, 10, 99, 100, 7999, 8000, 30521, 123456789])
def test_decimal_at_most(top: int) -> None:
    pattern = re.compile(decimal_at_most(top))
    for number in [*range(0, 1000, 7), *range(top - 12, top + 12), 999_999_999]:
        for text in (str(number), str(number).zfill(9), str(number).zfill(10)):
            if number >= 0:
                assert bool(pattern.fullmatch(text)) == (len(text) <= 9 and int(text) <= top), (top, text)


def _example(document: dict[str, Any], operation: dict[str, Any]) -> Any:
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    name = schema["$ref"].rsplit("/", 1)[1]
    return document["components"]["schemas"][name]["examples"][0]


async def every_example(served: Any) -> list[str]:
    """Send each operation's example (body, and path parameters) as /docs pre-fills it; each must answer
    2xx. The operations tried."""
    document = served.app.openapi()
    tried = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            url = path
            for param in operation.get("parameters", []):
                if param["in"] == "path":
                    url = url.replace(f"{{{param['name']}}}", param["example"])
            body = _example(document, operation) if "requestBody" in operation else None
            response = await served.client.request(method.upper(), url, json=body)
            assert response.status_code < 400, (method, url, body, response.status_code, response.text[:300])
            tried.append(f"{method.upper()} {path}")
    return tried


async def test_every_example_succeeds_as_shown(served) -> None:
    """/docs showed `"model": "string"` (a 404), `logit_bias: {"additionalProp1": 0}` (a 422) and a seed
    maximum it could not send."""
    tried = await every_example(served)
    assert "POST /models/classifier" in tried and "POST /v1/completions" in tried
    assert len(tried) >= 20, tried


@pytest.mark.parametrize("model", ["translator", "generator", "classifier"])
async def test_a_server_of_one_task_documents_only_its_routes(serving, model: str) -> None:
    """With SERVE_MODELS limited to one model, /docs showed the other tasks' routes, whose examples answer 404."""
    async with serving(models=model) as s:
        tried = await every_example(s)
    task = s.engine.services[model].artifact.task
    for other, record in records().items():
        assert all((f"POST {p}" in tried) == (other == task) for p in record.routes), (model, other, tried)
    assert set(records()) == set(TASKS)


async def test_a_chat_model_alone_documents_chat_and_no_other_task(serving, chat_artifacts) -> None:
    """The probe's case: SERVE_MODELS=<a chat model> listed /v1/translate and /v1/classify examples (404s)."""
    async with serving(artifacts_dir=chat_artifacts, models="chat") as s:
        tried = await every_example(s)
    assert "POST /v1/chat/completions" in tried and "POST /v1/completions" in tried
    assert not {"POST /v1/translate", "POST /v1/classify", "POST /v1/embeddings", "POST /rerank"} & set(tried)


def test_the_description_states_the_tasks_and_the_models_served(served) -> None:
    """ReDoc's and /docs' first paragraph: every task of contract/kinds.py, and each served model with its
    task and what its card says it is for (it said "One server for three transformers")."""
    text = served.app.openapi()["info"]["description"]
    assert all(records()[task].summary in text for task in TASKS)
    for name, info in served.engine.models.items():
        summary = use_summary(info.artifact.card) or no_use_summary(info.artifact.task)
        assert f"- `{name}` ({info.artifact.task}): {summary}" in text, name
    assert "three" not in text.lower()


def test_translate_fields_named_in_the_docs_are_the_servers(served) -> None:
    """docs/serve-your-own-model.md names the translation features by their request field, "n-best
    (`n_best`)": each is a field of POST /v1/translate (it once said `num_return_sequences`)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "serve-your-own-model.md").read_text()
    named = re.findall(r"\(`([a-z][a-z0-9_]*)`\)", doc)
    fields = served.app.openapi()["components"]["schemas"]["TranslateRequest"]["properties"]
    assert "n_best" in named and set(named) <= set(fields), sorted(set(named) - set(fields))


def test_dispatch_routes_state_their_bodies(served) -> None:
    """POST / takes its default model's request (the generator's: TGI); POST /models/{name} is one
    operation per served model with its task's request (a body for one task is refused by another)."""
    document = served.app.openapi()
    paths = document["paths"]

    def body(path: str) -> str:
        ref = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert isinstance(ref, str), ref
        return ref

    assert body("/").endswith("/RootTgiRequest")  # TGI's, naming its task (service/api/hf/tasks.py)
    assert "/models/{name}" not in paths
    assert body("/models/generator").endswith("/TgiRequest")
    assert body("/models/translator").endswith("/TranslationRequest")
    assert body("/models/classifier").endswith("/ClassificationRequest")
    for path in ("/models/{name}/info", "/models/{name}/health", "/v1/models/{model_id}"):
        (param,) = paths[path]["get"]["parameters"]
        assert set(param["schema"]["enum"]) == set(served.engine.models)


def test_dispatch_bodies_without_an_engine() -> None:
    """Before start-up (no models known) the dispatch routes take the request of any task."""
    from service.app import create_app

    document = create_app().openapi()
    schema = document["paths"]["/models/{name}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in schema["anyOf"]} == {
        "TgiRequest", "ClassificationRequest", "TranslationRequest", "EmbeddingModelRequest"
    }  # fmt: skip
    assert "TranslationRequest" in document["components"]["schemas"]


async def test_get_root_is_documented_and_405_lists_every_method(served) -> None:
    """GET / (the playground redirect) answered without being in the document; a 405 on / said
    `Allow: POST` though GET is served there too."""
    operation = served.app.openapi()["paths"]["/"]["get"]
    assert "307" in operation["responses"]
    response = await served.client.get("/")
    assert response.status_code == 307 and response.headers["location"] == "/playground"
    refused = await served.client.put("/")
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, POST"
    assert (await served.client.delete("/v1/classify")).headers["allow"] == "POST"


async def test_per_model_limits_with_models_of_other_vocabularies(serving) -> None:
    """Models of other vocabularies side by side (the committed artifacts: 8,000 and 30,522 ids): a token
    id's bound follows the model the request names, or the default one when it names none."""
    async with serving(artifacts_dir=REAL_ARTIFACTS, models="generator,classifier-minilm,classifier") as s:
        big = s.engine.models["classifier-minilm"].artifact.vocab_size - 1
        assert big >= s.engine.models["generator"].artifact.vocab_size
        await assert_agree(s, [
            ("/detokenize", {"model": "classifier-minilm", "tokens": [big]}),
            ("/detokenize", {"model": "classifier-minilm", "tokens": [big + 1]}),
            ("/detokenize", {"model": "generator", "tokens": [big]}),
            ("/detokenize", {"model": None, "tokens": [big]}),
            ("/detokenize", {"tokens": [big]}),
        ])  # fmt: skip


@pytest.mark.parametrize("with_encoders", [False, True])
async def test_schemathesis_can_generate_every_request(serving, tiny_artifacts_with_encoders, with_encoders) -> None:
    """Each request body stays one that schemathesis can draw data from: with one if/then per value of n
    (2^32 alternatives) it could not, and the whole operation went untested (a "Schema Error"). With the
    embedder and reranker served, their routes are in the document too."""
    overrides = {"artifacts_dir": tiny_artifacts_with_encoders} if with_encoders else {}
    async with serving(**overrides) as served:
        document = served.app.openapi()
    if with_encoders:
        assert {"/v1/embeddings", "/embed", "/rerank"} <= set(document["paths"])
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if "requestBody" in operation:
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                form = jsonschema_rs.canonicalize({**body, "components": document["components"]})
                assert form.kind != canonical.CanonicalKind.RAW, (method, path)
