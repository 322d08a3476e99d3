"""List bombs: a body under the size limit holding 100,000 items (or unknown fields, or logit-bias entries) is
refused at once with a 422 that names the field and the limit, lists a bounded number of errors, and a large
body is parsed and validated off the event loop (service/api/asgi/lean_route.py)."""

from __future__ import annotations

import json
import threading
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from service.api.asgi.lean_route import LARGE_BODY_BYTES, LeanRoute
from service.api.deps import EngineDep
from service.api.errors import MAX_ERRORS, _validation_response, install_error_handlers
from service.api.native.schemas import MAX_ITEMS, Lenient
from service.api.native.schemas import Request as StrictRequest
from service.app import create_app
from service.settings import Settings

N = 100_000
TEXTS = ["x"] * N

# (path, body, the field the 422 names, the limit it states or None where the first wrong item is named)
BOMBS: list[tuple[str, dict[str, Any], str, int | None]] = [
    ("/v1/embeddings", {"input": TEXTS}, "input", MAX_ITEMS),
    ("/v1/embeddings", {"input": [[0]] * N}, "input", MAX_ITEMS),
    ("/embed", {"inputs": TEXTS}, "inputs", MAX_ITEMS),
    ("/rerank", {"query": "q", "texts": TEXTS}, "texts", MAX_ITEMS),
    ("/v1/classify", {"text": TEXTS}, "text", MAX_ITEMS),
    ("/v1/translate", {"text": TEXTS}, "text", MAX_ITEMS),
    ("/v1/completions", {"model": "generator", "prompt": TEXTS}, "prompt", MAX_ITEMS),
    ("/v1/completions", {"model": "generator", "prompt": [[0]] * N}, "prompt", MAX_ITEMS),
    ("/v1/completions", {"model": "generator", "prompt": "a", "stop": TEXTS}, "stop", 4),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXTS}]}, "messages[0].content[0]", None),
    ("/v1/chat/completions", {"messages": TEXTS}, "messages[0]", None),
    ("/v1/generate", {"prompt": TEXTS}, "prompt[0]", None),
    ("/v1/generate", {"prompt": "a", "stop": TEXTS}, "stop", 16),
    ("/generate", {"inputs": "a", "parameters": {"stop": TEXTS}}, "parameters.stop", 4),
    ("/generate_stream", {"inputs": "a", "parameters": {"stop": TEXTS}}, "parameters.stop", 4),
    ("/models/classifier", {"inputs": TEXTS}, "inputs", MAX_ITEMS),
    ("/models/translator", {"inputs": TEXTS}, "inputs", MAX_ITEMS),
    ("/detokenize", {"tokens": TEXTS}, "tokens[0]", None),
]


def error_of(r: httpx.Response) -> dict[str, Any]:
    """The error as our shape, from any protocol's (OpenAI's, TEI's)."""
    body = r.json()
    error = body["error"]
    if isinstance(error, str):  # TEI: {"error": message, "error_type", "field"}
        return {"message": error, "field": body.get("field")}
    if "param" in error:  # OpenAI
        return {"message": error["message"], "field": error["param"]}
    return dict(error)


@pytest.mark.parametrize(("path", "body", "field", "limit"), BOMBS, ids=[f"{b[0]}:{b[2]}" for b in BOMBS])
async def test_a_list_bomb_is_one_short_422_naming_the_field(served, path, body, field, limit) -> None:
    content = json.dumps(body).encode()
    assert LARGE_BODY_BYTES < len(content) < Settings().max_body_bytes
    r = await served.client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    error = error_of(r)
    assert error["field"] == field, error
    if limit is not None:
        assert error["message"] == f"{field}: at most {limit} items, not {N}", error
    assert len(r.content) < 2_000 and len(error.get("details", [])) <= MAX_ERRORS  # no error per item


async def test_as_many_items_as_the_limit_are_taken(served) -> None:
    r = await served.client.post("/v1/classify", json={"text": ["a"] * (MAX_ITEMS + 1)})
    assert r.status_code == 422 and error_of(r)["message"] == f"text: at most {MAX_ITEMS} items, not {MAX_ITEMS + 1}"
    r = await served.client.post("/v1/classify", json={"text": ["a"] * MAX_ITEMS})  # past the queue: the engine's
    assert r.status_code == 422 and "SERVE_MAX_QUEUE_SIZE" in error_of(r)["message"]


async def test_many_unknown_fields_are_one_error_naming_the_first(served) -> None:
    unknown = 60_000  # what fits in the body limit
    body = {"prompt": "a", **{f"k{i}": 0 for i in range(unknown)}}
    r = await served.client.post("/v1/generate", json=body)
    assert r.status_code == 422
    error = error_of(r)
    said = f"Extra inputs are not permitted ({unknown:,} unknown fields)"
    assert error == {"type": "validation_error", "field": "k0", "message": f"k0: {said}",
                     "details": [{"field": "k0", "message": said}]}  # fmt: skip
    r = await served.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a", **body}]})
    assert r.status_code == 422 and error_of(r)["field"] == "messages[0].prompt", r.text[:300]
    few = await served.client.post("/v1/generate", json={"prompt": "a", "k0": 0, "k1": 0})  # as ever: each named
    assert few.status_code == 422 and [d["field"] for d in error_of(few)["details"]] == ["k0", "k1"]


async def test_logit_bias_entries_are_counted_before_they_are_checked(served) -> None:
    body = {"model": "generator", "prompt": "a", "logit_bias": {str(i): "x" for i in range(50_000)}}
    r = await served.client.post("/v1/completions", json=body)
    assert r.status_code == 422 and error_of(r) == {"message": "logit_bias: at most 300 items, not 50000",
                                                     "field": "logit_bias"}  # fmt: skip


async def test_a_422_lists_a_bounded_number_of_errors_and_counts_them(served) -> None:
    body = {
        "prompt": 1.5, "model": 5, "stop": 5, "max_new_tokens": "x", "seed": "x", "temperature": "x", "top_k": "x",
        "top_p": "x", "repetition_penalty": "x", "ignore_eos": "x", "stream": "x", "logprobs": "x",
        "top_logprobs": "x", "return_attention": "x", **{f"k{i}": 0 for i in range(5)},
    }  # fmt: skip
    r = await served.client.post("/v1/generate", json=body)
    error = error_of(r)
    assert r.status_code == 422 and len(error["details"]) == MAX_ERRORS
    assert error["message"].endswith(f"; 21 errors, the first {MAX_ERRORS} in details)"), error["message"]
    errors = [{"type": "int_type", "loc": ("body", "tokens", i), "msg": "Input should be a valid integer"}
              for i in range(N)]  # fmt: skip
    answer = json.loads(bytes(_validation_response(RequestValidationError(errors)).body))["error"]
    assert answer["field"] == "tokens[0]" and len(answer["details"]) == MAX_ERRORS
    assert answer["message"] == f"tokens[0]: Input should be a valid integer ({N:,} errors, the first 16 in details)"


async def test_large_bodies_keep_their_integral_floats_as_integers(served) -> None:
    """Parsed with its integral floats read as ints (the models then skip their own walk): the same answers
    as a small body, on a lean route and on the Inference API's."""
    ids = [1, 2, 3] * 10_000
    as_floats = json.dumps({"tokens": [float(i) for i in ids]}).encode()
    assert len(as_floats) > LARGE_BODY_BYTES
    r = await served.client.post("/detokenize", content=as_floats, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == (await served.client.post("/detokenize", json={"tokens": ids})).json()
    bad = await served.client.post("/detokenize", json={"tokens": [*ids, 1.5]})
    assert bad.status_code == 422 and error_of(bad)["field"] == f"tokens[{len(ids)}]"
    long_text = "word " * 20_000
    for top_k in (2, 2.0):
        r = await served.client.post(
            "/models/classifier", json={"inputs": long_text, "parameters": {"top_k": top_k, "truncate": True}}
        )
        assert r.status_code == 200 and len(r.json()[0]) == 2, r.text[:300]
    r = await served.client.post("/models/classifier", json={"inputs": long_text, "parameters": {"top_k": 2.5}})
    assert r.status_code == 422 and error_of(r)["field"] == "parameters.top_k"


# --- the lean handler on large bodies: FastAPI's answers, parsed off the event loop ---------------------


class Ask(StrictRequest):
    text: str
    n: int = 1


class Loose(Lenient):
    text: str
    n: int = 1


def echo_app(route_class: type[fastapi.routing.APIRoute]) -> FastAPI:
    app = FastAPI()
    app.state.engine = "the engine"
    install_error_handlers(app)
    router = APIRouter(route_class=route_class)

    @router.post("/echo")
    async def echo(body: Ask, engine: EngineDep, request: Request) -> dict[str, Any]:
        return {"text": len(body.text), "n": body.n}

    @router.post("/dispatch")  # validates in the endpoint, as the Inference API's routes do
    async def dispatch(payload: dict[str, Any], engine: EngineDep, q: int = 0) -> dict[str, Any]:
        loose = Loose.model_validate(payload)
        return {"text": len(loose.text), "n": loose.n}

    app.include_router(router)
    return app


BIG = "y" * (2 * LARGE_BODY_BYTES)
LARGE_BODIES = [
    ("/echo", json.dumps({"text": BIG, "n": 2.0}).encode()),
    ("/echo", json.dumps({"text": BIG, "n": 2.5}).encode()),
    ("/echo", json.dumps({"text": BIG, "n": 2}).encode()[:-1]),  # invalid JSON at its very end
    ("/echo", json.dumps({"text": BIG, **{f"k{i}": 0 for i in range(40)}}).encode()),
    ("/echo", json.dumps({"text": [BIG]}).encode()),
    ("/dispatch", json.dumps({"text": BIG, "n": 3.0}).encode()),
    ("/dispatch", json.dumps({"text": BIG}).encode()[:-1]),
]


async def answers(app: FastAPI) -> list[tuple[int, bytes]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return [
            ((r := await client.post(path, content=body, headers={"content-type": "application/json"})).status_code,
             r.content)
            for path, body in LARGE_BODIES
        ]  # fmt: skip


async def test_large_bodies_are_answered_as_fastapi_answers_them_off_the_loop(monkeypatch) -> None:
    parsed_on: list[str] = []
    loads = json.loads

    def recording(raw: Any, *args: Any, **kwargs: Any) -> Any:
        if len(raw) > LARGE_BODY_BYTES:
            parsed_on.append(threading.current_thread().name)
        return loads(raw, *args, **kwargs)

    plain = await answers(echo_app(fastapi.routing.APIRoute))
    monkeypatch.setattr(json, "loads", recording)
    lean = await answers(echo_app(LeanRoute))
    for (path, body), mine, theirs in zip(LARGE_BODIES, lean, plain, strict=True):
        assert mine == theirs, (path, body[-40:], mine, theirs)
    assert [status for status, _ in lean] == [200, 422, 400, 422, 422, 200, 400]
    assert json.loads(lean[5][1]) == {"text": len(BIG), "n": 3}
    assert parsed_on and all(name.startswith("large-body") for name in parsed_on), parsed_on


def test_every_request_list_is_bounded() -> None:
    """Every list a request model takes stops at its first wrong item, and every list of anything but token ids
    (whose number the engine bounds) has a length limit; a dict of checked values has one too."""
    create_app(Settings())  # imports every route module

    def subclasses(cls: type[BaseModel]) -> set[type[BaseModel]]:
        return {s for c in cls.__subclasses__() for s in {c, *subclasses(c)}}

    unbounded = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            kind, items = node.get("type"), node.get("items_schema") or node.get("values_schema") or {}
            if kind == "list" and not (
                node.get("fail_fast") and (node.get("max_length") or items.get("type") == "int")
            ):
                unbounded.append(where)
            if kind == "dict" and items.get("type") != "any" and not node.get("max_length"):
                unbounded.append(where)
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    models = subclasses(StrictRequest) | subclasses(Lenient)
    assert len(models) > 20
    for model in models:
        walk(model.__pydantic_core_schema__, model.__name__)
    assert not unbounded, unbounded


async def test_the_document_states_the_lower_of_the_queue_and_the_schemas_ceiling(serving) -> None:
    for queue, most in ((64, 64), (4 * MAX_ITEMS, MAX_ITEMS)):
        async with serving(max_queue_size=queue) as s:
            schemas = s.app.openapi()["components"]["schemas"]
            for component, field in (("ClassifyRequest", "text"), ("SimilarityInputs", "sentences")):
                arrays = [
                    m
                    for m in schemas[component]["properties"][field].get(
                        "anyOf", [schemas[component]["properties"][field]]
                    )
                    if m.get("type") == "array"
                ]
                expected = most - 1 if component == "SimilarityInputs" and most == queue else most
                assert arrays and {a["maxItems"] for a in arrays} == {expected}, (queue, component, arrays)
