"""The one base of this server's pure ASGI middleware (streaming-safe, unlike BaseHTTPMiddleware)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """Handles HTTP requests that `applies` to with `handle`; anything else (lifespan, websockets, the
    requests it leaves alone) goes straight to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def applies(self, scope: Scope) -> bool:
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.applies(scope):
            await self.handle(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError
