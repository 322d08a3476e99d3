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

A body past LARGE_BODY_BYTES is parsed and validated on a thread of its own, not on the event loop: a
megabyte of token ids takes ~50 ms (more on a busy machine), and eight at once would hold /health and
every stream that long. Its 400 or 422 is raised from there with the errors FastAPI's handler would find
(the same validation of the same value), not by parsing it again on the loop. Its integral floats are
read as ints as it is parsed, so the request models skip their walk over it (service/api/json_numbers.py).
On a route of another shape (the Inference API's, which validate in the endpoint) a large body is parsed
there too, and FastAPI's handler takes it as parsed.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fastapi.routing
from fastapi import Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, serialize_response
from pydantic import BaseModel

from service.api.deps import get_engine
from service.api.native.schemas import FLOATS_READ_AS_INTS, json_number

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

JSON_CONTENT_TYPES = frozenset({"application/json", "application/json; charset=utf-8"})
# Bodies past this size are parsed and validated off the event loop (at most ~3 ms of it on the loop: token
# ids cost ~50 us per KB to parse and validate, texts far less); one thread, so that a burst of them
# takes one core, not the loop's.
LARGE_BODY_BYTES = 64 * 1024
_parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-body")


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
            return fastapi_handler if self.body_field is None else _parsing_large_bodies(fastapi_handler)
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
            large = len(raw) > LARGE_BODY_BYTES
            value = await _off_loop(_validated, raw, body_field, True) if large else _validated(raw, body_field)
            if isinstance(value, _Invalid):  # FastAPI's 400 or 422, exactly as it words it
                if large and value.errors is not None:  # the errors its handler finds, without parsing again
                    raise RequestValidationError(value.errors)
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


def _parsing_large_bodies(fastapi_handler: Handler) -> Handler:
    """FastAPI's handler, for a route of another shape that takes a body: a large JSON body is parsed on the
    body thread and left where FastAPI's handler reads it (Starlette's cache of `request.json()`), so only
    what the endpoint does with it runs on the loop."""

    async def handle(request: Request) -> Response:
        if request.headers.get("content-type") in JSON_CONTENT_TYPES:
            raw = await request.body()
            if len(raw) > LARGE_BODY_BYTES:
                parsed = await _off_loop(_parsed, raw, True)
                if isinstance(parsed, _Invalid):
                    if parsed.errors is not None:
                        raise RequestValidationError(parsed.errors)
                else:
                    request._json = parsed  # what Starlette's request.json() returns from now on
                    token = FLOATS_READ_AS_INTS.set(True)
                    try:
                        return await fastapi_handler(request)
                    finally:
                        FLOATS_READ_AS_INTS.reset(token)
        return await fastapi_handler(request)

    return handle


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_parser, _without_gc, fn, *args)


def _without_gc(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with the cyclic garbage collector paused: a large body is up to ~200,000 new lists and
    dicts, which would set off full collections over the whole heap, each holding the GIL (and so the
    loop) for tens of ms. A parsed body holds no reference cycles: reference counting frees it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return fn(*args)
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class _Invalid:
    """A body that is not valid: FastAPI's errors of it (None: JSON this parser does not read, too deeply
    nested or not UTF-8, which FastAPI's handler answers)."""

    errors: list[Any] | None


def _parsed(raw: bytes, large: bool = False) -> Any:
    """The body as FastAPI's handler parses it (`json.loads`), or _Invalid. `large`: its integral floats
    read as ints (service/api/native/schemas.py FLOATS_READ_AS_INTS)."""
    try:
        return json.loads(raw, parse_float=json_number) if large else json.loads(raw)
    except json.JSONDecodeError as e:  # FastAPI's error for it (fastapi.routing.get_request_handler)
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {}}
        return _Invalid([{**error, "ctx": {"error": e.msg}}])
    except Exception:
        return _Invalid(None)


def _validated(raw: bytes, body_field: Any, large: bool = False) -> Any:
    """The body's value, as FastAPI's handler parses and validates one JSON body, or _Invalid."""
    parsed = _parsed(raw, large)
    if isinstance(parsed, _Invalid):
        return parsed
    token = FLOATS_READ_AS_INTS.set(large)
    try:
        value, errors = body_field.validate(parsed, {}, loc=("body",))
    finally:
        FLOATS_READ_AS_INTS.reset(token)
    if not errors:
        return value
    # Without the wrong inputs (the 422 does not quote them; a too-long list's is the whole list): a large
    # body is then freed here, on its thread, not on the loop once its 422 is sent.
    return _Invalid([{k: v for k, v in e.items() if k != "input"} for e in errors])
