"""The hot routes' request handler: a valid JSON body goes straight to the endpoint, without FastAPI's
general request machinery.

For each request FastAPI's handler extracts the endpoint's context for error messages, parses the
content type with `email.message`, solves the dependency graph, enters telemetry scopes and validates
the returned model once more before serializing it. For a route of the shape every inference route has
(one JSON body model, the engine dependency, the Request), `LeanRoute` does only what that shape needs:
read the body, `json.loads` it and validate it with the route's own body field (FastAPI's two calls, so
the endpoint gets the same value), call the endpoint, and serialize its answer as FastAPI would.

Anything else goes to FastAPI's handler, with the body already read: a body that is not JSON or not
valid (so 400s and 422s keep FastAPI's exact errors), another content type, and any route of another
shape. `/docs` and the OpenAPI schema are FastAPI's, untouched: only the handler differs.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Coroutine
from typing import Any

import fastapi.routing
from fastapi import Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, serialize_response
from pydantic import BaseModel

from service.api.deps import get_engine

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

JSON_CONTENT_TYPES = frozenset({"application/json", "application/json; charset=utf-8"})


def _lean_shape(route: Any) -> tuple[str, str | None, str | None] | None:
    """(body parameter, engine parameter, request parameter) of an async endpoint that takes one JSON body
    model, the engine and the Request, and nothing else (no query, path, header or cookie parameters, no
    other dependencies, no Response or background tasks), answers 200 with FastAPI's default response
    class, and does not stream from a generator; None for any other endpoint."""
    d: Dependant | None = route.dependant
    if d is None:
        return None
    body = route.body_field
    if route.dependencies or body is None or len(d.body_params) != 1 or getattr(body.field_info, "embed", False):
        return None
    model = body.field_info.annotation
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    if d.path_params or d.query_params or d.header_params or d.cookie_params:
        return None
    if d.response_param_name or d.background_tasks_param_name or d.websocket_param_name:
        return None
    if not inspect.iscoroutinefunction(d.call) or route.status_code not in (None, 200):
        return None
    if not isinstance(route.response_class, DefaultPlaceholder):
        return None
    engine = None
    for sub in d.dependencies:
        plain = not (sub.body_params or sub.query_params or sub.header_params or sub.dependencies)
        if sub.call is not get_engine or not plain or sub.name is None or engine is not None:
            return None
        engine = sub.name
    return d.body_params[0].name, engine, d.request_param_name


def _as_included(route: APIRoute) -> Any:
    """The route as its router's inclusion made it (the includer's dependencies and response class added),
    as FastAPI's own `get_route_handler` reads it (fastapi is pinned; None if this FastAPI has no such
    context: then FastAPI's handler serves the route)."""
    context_var = getattr(fastapi.routing, "_effective_route_context_var", None)
    if context_var is None:
        return None
    context = context_var.get()
    return context if context is not None and context.original_route is route else route


class LeanRoute(APIRoute):
    """An APIRoute whose handler takes the short way for valid JSON bodies (module docstring)."""

    def get_route_handler(self) -> Handler:
        fastapi_handler = super().get_route_handler()
        route = _as_included(self)
        shape = None if route is None else _lean_shape(route)
        if route is None or shape is None:
            return fastapi_handler
        body_name, engine_name, request_name = shape
        call = route.dependant.call
        body_field, response_field = route.body_field, route.response_field
        default_response: type[Response] = route.response_class.value
        exclude_none = route.response_model_exclude_none
        overrides = getattr(route.dependency_overrides_provider, "dependency_overrides", {})

        async def handle(request: Request) -> Response:
            if request.headers.get("content-type") not in JSON_CONTENT_TYPES or overrides:
                return await fastapi_handler(request)
            raw = await request.body()  # a body refused on the way (size, time) raises to its middleware here
            try:
                parsed = json.loads(raw)
            except Exception:  # invalid JSON, or nested past the parser's depth: FastAPI answers (400 or 422)
                return await fastapi_handler(request)
            value, errors = body_field.validate(parsed, {}, loc=("body",))
            if errors:  # FastAPI's 422, exactly as it words it
                return await fastapi_handler(request)
            kwargs: dict[str, Any] = {body_name: value}
            if engine_name is not None:
                kwargs[engine_name] = await get_engine(request)
            if request_name is not None:
                kwargs[request_name] = request
            answer = await call(**kwargs)
            if isinstance(answer, Response):
                return answer
            content = await serialize_response(
                field=response_field,
                response_content=answer,
                exclude_none=exclude_none,
                dump_json=response_field is not None,
            )
            if response_field is None:  # no response model: FastAPI's JSONResponse of the encoded value
                return default_response(content)
            return Response(content, media_type="application/json")

        return handle
