"""The hot routes' short handler (service/api/asgi/lean_route.py) answers exactly as FastAPI's own does, and the
routes added one by one (service/api/routes.py) document and serve as include_router's."""

from __future__ import annotations

import json
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.dependencies.utils import solve_dependencies
from pydantic import BaseModel, Field

from service.api.asgi.lean_route import LeanRoute, _lean_shape
from service.api.deps import EngineDep, get_engine
from service.api.native import classify, generate, health, translate
from service.api.openai import chat, completions, embeddings
from service.api.routes import add_routes
from service.api.tei import routes as tei
from service.api.tgi import routes as tgi
from service.app import ERRORS, create_app
from service.settings import Settings


class Ask(BaseModel):
    text: str = Field(min_length=1)
    n: int = 1
    note: str | None = None


class Answer(BaseModel):
    text: str
    n: int
    note: str | None = None
    engine: str


def echo_router(route_class: type[fastapi.routing.APIRoute]) -> APIRouter:
    router = APIRouter(route_class=route_class)

    @router.post("/echo", response_model=Answer, response_model_exclude_none=True)
    async def echo(body: Ask, engine: EngineDep, request: Request) -> Any:
        if body.text == "boom":
            raise ValueError("boom")
        return Answer(text=body.text * body.n, n=body.n, note=body.note, engine=str(engine))

    @router.post("/plain")
    async def plain(body: Ask, engine: EngineDep) -> dict[str, Any]:  # no response model: jsonable
        return {"text": body.text, "engine": str(engine)}

    @router.post("/query")
    async def query(body: Ask, engine: EngineDep, q: int = 0) -> dict[str, Any]:  # another shape
        return {"q": q}

    return router


def echo_app(route_class: type[fastapi.routing.APIRoute]) -> FastAPI:
    app = FastAPI()
    app.state.engine = "the engine"

    @app.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> Any:
        from fastapi.responses import JSONResponse

        return JSONResponse({"error": str(exc)}, status_code=418)

    app.include_router(echo_router(route_class))
    return app


BODIES: list[tuple[str, bytes, dict[str, str]]] = [
    ("/echo", b'{"text": "ab", "n": 2}', {"content-type": "application/json"}),
    ("/echo", b'{"text": "ab", "note": "x"}', {"content-type": "application/json; charset=utf-8"}),
    ("/echo", b'{"text": "ab"}', {"content-type": "application/json; charset=UTF-8"}),  # FastAPI's parse
    ("/echo", b'{"text": "ab"}', {"content-type": "application/vnd.api+json"}),
    ("/echo", b'{"text": "ab"}', {"content-type": "text/plain"}),
    ("/echo", b'{"text": "ab"}', {}),
    ("/echo", b'{"text": ""}', {"content-type": "application/json"}),  # 422
    ("/echo", b'{"text": "ab", "n": "x"}', {"content-type": "application/json"}),
    ("/echo", b'{"text": "ab", "n": 1.5}', {"content-type": "application/json"}),
    ("/echo", b'{"text": "ab"', {"content-type": "application/json"}),  # invalid JSON
    ("/echo", b"", {"content-type": "application/json"}),
    ("/echo", b"[" * 100_000 + b"]" * 100_000, {"content-type": "application/json"}),  # past the parser's depth
    ("/echo", b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", {"content-type": "application/json"}),
    ("/echo", b"null", {"content-type": "application/json"}),
    ("/echo", b"[1, 2]", {"content-type": "application/json"}),
    ("/echo", b'{"text": "boom"}', {"content-type": "application/json"}),  # the app's exception handler
    ("/plain", b'{"text": "ab"}', {"content-type": "application/json"}),
    ("/query?q=3", b'{"text": "ab"}', {"content-type": "application/json"}),
]


async def answers(app: FastAPI) -> list[tuple[int, dict[str, str], bytes]]:
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        for path, body, headers in BODIES:
            response = await client.post(path, content=body, headers=headers)
            out.append((response.status_code, dict(response.headers), response.content))
    return out


async def test_lean_answers_exactly_as_fastapi() -> None:
    lean, plain = await answers(echo_app(LeanRoute)), await answers(echo_app(fastapi.routing.APIRoute))
    for (path, body, headers), mine, theirs in zip(BODIES, lean, plain, strict=True):
        assert mine == theirs, (path, body, headers)
    statuses = [status for status, _, _ in lean]
    expected = [200, 200, 200, 200, 422, 422, 422, 422, 422, 422, 422, 400, 400, 422, 422, 418, 200, 200]
    assert statuses == expected, statuses
    assert json.loads(lean[0][2]) == {"text": "abab", "n": 2, "engine": "the engine"}  # None left out


async def test_valid_json_skips_fastapis_dependency_solving(monkeypatch: pytest.MonkeyPatch) -> None:
    solved: list[str] = []
    solve = solve_dependencies

    async def counting(*args: Any, **kwargs: Any) -> Any:
        solved.append(kwargs["request"].url.path)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    app = echo_app(LeanRoute)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.post("/echo", json={"text": "a"})).status_code == 200
        assert (await client.post("/plain", json={"text": "a"})).status_code == 200
        assert solved == []
        assert (await client.post("/echo", json={"text": ""})).status_code == 422  # FastAPI words the 422
        assert (await client.post("/query?q=1", json={"text": "a"})).status_code == 200  # not the lean shape
    assert solved == ["/echo", "/query"]


def test_the_inference_routes_take_the_short_way() -> None:
    modules = (classify, generate, translate, completions, chat, embeddings, tei, tgi)
    lean = {route.path for m in modules for route in m.router.routes if _lean_shape(route)}
    assert lean == {
        "/v1/classify", "/v1/generate", "/v1/translate", "/v1/completions", "/v1/chat/completions",
        "/v1/embeddings", "/embed", "/rerank", "/generate", "/generate_stream",
    }


def test_routes_added_one_by_one_document_as_included() -> None:
    settings = Settings()
    served = create_app(settings).openapi()
    included = FastAPI(title=served["info"]["title"], version=served["info"]["version"])
    for module, responses in ((classify, ERRORS), (tei, tei.TEI_ERRORS), (health, None)):
        included.include_router(module.router, responses=responses)
    added = FastAPI(title=served["info"]["title"], version=served["info"]["version"])
    for module, responses in ((classify, ERRORS), (tei, tei.TEI_ERRORS), (health, None)):
        add_routes(added, module.router, responses)
    assert json.dumps(added.openapi(), sort_keys=True) == json.dumps(included.openapi(), sort_keys=True)
    assert served["paths"]["/v1/classify"] == added.openapi()["paths"]["/v1/classify"]
    assert all(not isinstance(route, fastapi.routing._IncludedRouter) for route in create_app(settings).routes)


async def test_dependency_overrides_take_fastapis_way() -> None:
    app = echo_app(LeanRoute)

    async def other() -> str:
        return "another engine"

    app.dependency_overrides[get_engine] = other
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.post("/echo", json={"text": "a"})).json()["engine"] == "another engine"
