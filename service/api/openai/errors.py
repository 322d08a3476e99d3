"""OpenAI's error body on the OpenAI-compatible routes (`/v1/completions`, `/v1/chat/completions`,
`/v1/embeddings`, `/v1/models...`): `{"error": {"message", "type", "param", "code"}}`, so the OpenAI SDKs
fill `e.param` and `e.code`.
Every other route keeps the project's shape (service/api/errors.py)."""

from __future__ import annotations

from typing import Any

from service.api.asgi.error_rewrite import ErrorShapeMiddleware, on_paths

OPENAI_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models")
# Our error types that OpenAI names otherwise.
CODES = {"unauthorized": "invalid_api_key", "model_not_loaded": "model_not_found"}


def openai_error_body(status: int, type: str, message: str, field: str | None) -> dict[str, Any]:
    if status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    param = None if field in (None, "body") else field
    return {"error": {"message": message, "type": kind, "param": param, "code": CODES.get(type, type)}}


def is_openai_path(path: str) -> bool:
    return on_paths(path, OPENAI_PATHS)


class OpenAIErrorMiddleware(ErrorShapeMiddleware):
    paths = OPENAI_PATHS

    def shape(self, status: int, type: str, message: str, field: str | None) -> Any:
        return openai_error_body(status, type, message, field)
