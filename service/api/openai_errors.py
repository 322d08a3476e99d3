"""OpenAI's error body on the OpenAI-compatible routes (`/v1/completions`, `/v1/models...`):
`{"error": {"message", "type", "param", "code"}}`, so the OpenAI SDKs fill `e.param` and `e.code`.
Every other route keeps the project's shape (service/api/errors.py).

A middleware rewrites the project's error bodies on those paths, so every error source (validation,
the engine, auth, body limit, 500s) gets the same treatment without a second set of handlers."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from service.api.asgi import HttpMiddleware

OPENAI_PATHS = ("/v1/completions", "/v1/models")
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
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS)


class OpenAIErrorMiddleware(HttpMiddleware):
    def applies(self, scope: Scope) -> bool:
        return is_openai_path(scope["path"])

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        body = b""

        async def rewrite(message: Message) -> None:
            nonlocal start, body
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if message["status"] >= 400 and headers.get(b"content-type", b"").startswith(b"application/json"):
                    start = message  # hold it until the (small) error body is complete
                    return
            if start is None:
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body", False):
                return
            new_body = _converted(start["status"], body)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(new_body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": new_body, "more_body": False})

        await self.app(scope, receive, rewrite)


def _converted(status: int, body: bytes) -> bytes:
    try:
        error = json.loads(body)["error"]
        converted = openai_error_body(status, error["type"], error["message"], error.get("field"))
    except (ValueError, KeyError, TypeError):
        return body  # not the project's shape: leave it alone
    return json.dumps(converted).encode()
