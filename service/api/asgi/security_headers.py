"""Security headers on every response (the outermost middleware, so errors, 401s and preflights get them):
no MIME sniffing, no framing (clickjacking), no referrer, and a Content-Security-Policy. A page sets its
own policy (/docs and /redoc in service/api/docs/pages.py, /playground in service/api/docs/playground.py); anything
else is data, which needs no sources at all: `default-src 'none'`."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from service.api.asgi.base import HttpMiddleware

DATA_CSP = "default-src 'none'; frame-ancestors 'none'"
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", DATA_CSP.encode()),
)


class SecurityHeadersMiddleware(HttpMiddleware):
    """Adds each of HEADERS that the response does not already carry."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in HEADERS if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
