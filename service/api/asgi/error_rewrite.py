"""Other protocols' error bodies: a middleware rewrites the project's `{"error": {"type", "message", "field"}}`
on a protocol's paths into that protocol's shape (OpenAI's, TEI's), so every error source (validation, the
engine, auth, body limit, 500s) gets the same treatment without a second set of handlers."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from starlette.types import Message, Receive, Scope, Send

from service.api.asgi.base import HttpMiddleware


def on_paths(path: str, paths: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in paths)


class ErrorShapeMiddleware(HttpMiddleware):
    """Holds back a JSON error response on `paths` and sends `shape(status, type, message, field)` instead."""

    paths: ClassVar[tuple[str, ...]] = ()

    def applies(self, scope: Scope) -> bool:
        return on_paths(scope["path"], self.paths)

    def shape(self, status: int, type: str, message: str, field: str | None) -> Any:
        raise NotImplementedError

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        body = b""

        async def rewrite(message: Message) -> None:
            nonlocal start, body
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                if message["status"] >= 400 and content_type.startswith(b"application/json"):
                    start = message  # hold it until the (small) error body is complete
                    return
            if start is None:
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body", False):
                return
            new_body = self._converted(start["status"], body)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(new_body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": new_body, "more_body": False})

        await self.app(scope, receive, rewrite)

    def _converted(self, status: int, body: bytes) -> bytes:
        try:
            error = json.loads(body)["error"]
            converted = self.shape(status, error["type"], error["message"], error.get("field"))
        except (ValueError, KeyError, TypeError):
            return body  # not the project's shape: leave it alone
        return json.dumps(converted).encode()
