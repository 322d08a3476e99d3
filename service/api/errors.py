"""One error shape everywhere: `{"error": {"type": ..., "message": ..., "field": ...}}`.

Bad input is always a 4xx naming the field; a 500 means a bug or a failed model run, never the client."""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

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
# Union members in pydantic error locations ("str", "list[str]", "function-after[...]") are not fields.
_TYPE_TAG = re.compile(r"[\[\-]|^(str|int|float|bool|list|dict|none|tuple)$")


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
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return error_response(400, "invalid_json", f"the request body is not valid JSON: {detail}".rstrip(": "), "body")
    details = [{"field": field_path(e["loc"]), "message": e["msg"]} for e in errors]
    # With unions every member reports; the deepest location is the most specific ("text[0]", not "text").
    first = max(details, key=lambda d: d["field"].count("[") + d["field"].count("."))
    message = f"{first['field']}: {first['message']}"
    if len(details) > 1:
        message += f" (and {len(details) - 1} more)"
    return error_response(422, "validation_error", message, first["field"], details=details)


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
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(
            exc.status_code, HTTP_TYPES.get(exc.status_code, "http_error"), str(exc.detail), headers=exc.headers
        )


def log_internal_error(exc: BaseException, where: str) -> None:
    """Log a bug with its stack, but not its message: messages can quote the request (a token, a text)."""
    stack = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    log.error("internal error (%s) on %s; traceback, message withheld:\n%s", type(exc).__name__, where, stack)


def internal_error_response(request: Request, exc: BaseException) -> Response:
    """The 500 for an exception nothing else handled (see InternalErrorMiddleware): logged, never re-raised,
    so the server keeps the client's keep-alive connection open."""
    log_internal_error(exc, f"{request.method} {request.url.path}")
    return error_response(500, "internal_error", "internal server error")
