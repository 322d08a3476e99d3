"""One error shape everywhere: `{"error": {"type": ..., "message": ..., "field": ...}}`.

Bad input is always a 4xx naming the field; a 500 means a bug or a failed model run, never the client."""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import islice
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.asgi.allow import allowed_methods
from service.engine.errors import (
    EngineError,
    InferenceFailed,
    InvalidInput,
    ModelNotLoaded,
    QueueFull,
    RequestTimeout,
    Unavailable,
)

log = logging.getLogger(__name__)

ENGINE_STATUS: dict[type[EngineError], int] = {
    InvalidInput: 422,
    ModelNotLoaded: 404,
    QueueFull: 429,
    Unavailable: 503,
    RequestTimeout: 504,
    InferenceFailed: 500,
}
HTTP_TYPES = {
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    499: "client_closed_request",
}
# The errors a 422 formats and lists in `details`; past it, the message counts them.
MAX_ERRORS = 16
# Union members in pydantic error locations ("str", "list[str]", "function-after[...]") are not fields.
_TYPE_TAG = re.compile(r"[\[\-]|^(str|int|float|bool|list|dict|none|tuple)$")
# A union reports each member's error: "Input should be a valid string" from the `str` member says
# nothing when a list was sent. Errors of these kinds (the input is of another type) rank last.
_WRONG_TYPE = re.compile(r"_type$|^(none_required|model_attributes_type|is_instance_of)$")


class FieldError(ValueError):
    """A request model's cross-field check that names its field: a model validator's error has no location
    of its own (pydantic reports it at the body), so the handler takes the field from here."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ApiError(Exception):
    def __init__(
        self, status: int, type: str, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def error_body(type: str, message: str, field: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": type, "message": message, "field": field, **extra}}


def error_response(
    status: int,
    type: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(error_body(type, message, field, **extra), status_code=status, headers=dict(headers or {}))


def engine_error_response(exc: EngineError) -> JSONResponse:
    status = ENGINE_STATUS.get(type(exc), 500)
    headers = {}
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(exc.retry_after_s)
    if isinstance(exc, Unavailable):
        headers["Retry-After"] = "5"
    return error_response(status, exc.type, exc.message, exc.field, headers)


def sent_as(field: str | None, names: Mapping[str, str]) -> str | None:
    """An engine field ("max_new_tokens", "text[2]") renamed to what the client sent: its head through
    `names` ("max_tokens", "inputs[2]", "parameters.max_new_tokens"), the rest as it is."""
    if field is None:
        return None
    head = _head(field)
    return names[head] + field[len(head) :] if head in names else field


def _head(field: str) -> str:
    """The top-level request field of a path: "text[2]" -> "text", "parameters.top_k" -> "parameters"."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


@contextmanager
def fields_as_sent(names: Mapping[str, str]) -> Iterator[None]:
    """Engine errors raised in the block name the request field as the protocol's client spelled it: the
    engine knows its own option names (max_new_tokens), the route knows the client's (max_tokens)."""
    try:
        yield
    except EngineError as exc:
        exc.field = sent_as(exc.field, names)
        raise


def field_path(loc: Sequence[int | str]) -> str:
    """("body", "text", 2) -> "text[2]"; union-member tags are dropped."""
    path = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _TYPE_TAG.search(part):
            path += f".{part}" if path else part
    return path or "body"


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    every = exc.errors()
    # The first MAX_ERRORS only, and their number: the schemas keep it small (service/api/native/schemas.py), and
    # this keeps a body that still makes thousands of errors from formatting and sending them all.
    errors = list(islice(every, MAX_ERRORS))
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return error_response(400, "invalid_json", f"the request body is not valid JSON: {detail}".rstrip(": "), "body")
    details = [_detail(e) for e in errors]
    # With unions every member reports: a member of the input's type first, then the deepest location,
    # the most specific ("text[0]", not "text").
    ranked = sorted(
        zip(errors, details, strict=True),
        key=lambda ed: (bool(_WRONG_TYPE.search(ed[0].get("type", ""))), -_depth(ed[1]["field"])),
    )
    first = ranked[0][1]
    message = f"{first['field']}: {first['message']}"
    notes = []
    # Other fields at fault, by name: not the union members' alternatives for the same one.
    others = list(dict.fromkeys(_head(d["field"]) for d in details if _head(d["field"]) != _head(first["field"])))
    if others:
        notes.append(f"also wrong: {', '.join(others[:5])}{', ...' if len(others) > 5 else ''}")
    if len(every) > len(errors):
        notes.append(f"{len(every):,} errors, the first {len(errors)} in details")
    if notes:
        message += f" ({'; '.join(notes)})"
    return error_response(422, "validation_error", message, first["field"], details=details)


def _depth(field: str) -> int:
    return field.count("[") + field.count(".")


def _detail(error: Mapping[str, Any]) -> dict[str, str]:
    """One pydantic error as {field, message}: a FieldError names its own field; messages lose pydantic's
    "Value error, " prefix and its "after validation" wording."""
    field = field_path(error["loc"])
    message = str(error["msg"])
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, FieldError):
        field = cause.field if field == "body" else f"{field}.{cause.field}"
        message = cause.message
    elif error.get("type") == "too_long":
        ctx = error["ctx"]
        message = f"at most {ctx['max_length']} items, not {ctx['actual_length']}"
    return {"field": field, "message": message.removeprefix("Value error, ")}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.type, exc.message, exc.field, exc.headers)

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return engine_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:  # every method of the path, not only those of its first route
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        kind = HTTP_TYPES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail), headers=headers)


def log_internal_error(exc: BaseException, where: str) -> None:
    """Log a bug with its stack, but not its message: messages can quote the request (a token, a text)."""
    stack = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    log.error("internal error (%s) on %s; traceback, message withheld:\n%s", type(exc).__name__, where, stack)


def internal_error_response(request: Request, exc: BaseException) -> Response:
    """The 500 for an exception nothing else handled (see InternalErrorMiddleware): logged, never re-raised,
    so the server keeps the client's keep-alive connection open."""
    log_internal_error(exc, f"{request.method} {request.url.path}")
    return error_response(500, "internal_error", "internal server error")
