"""Optional bearer-token authentication (SERVE_API_KEY; off when unset).

A pure ASGI middleware, so the key is checked before anything reads the body: an unauthenticated
client gets 401 whatever it sends (never 400 or 413, which would tell it about the API)."""

from __future__ import annotations

import secrets

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.asgi.base import HttpMiddleware
from service.api.errors import error_response

# Open with a key set: probes and scraping. Everything else needs the key, routes added later included.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
# Open too when SERVE_PUBLIC_DOCS=true (a browser on /docs cannot send the key).
DOCS_PATHS = ("/docs", "/redoc", "/openapi.json", "/playground")  # the playground asks for the key itself


def authorized(authorization: str, key: SecretStr) -> bool:
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        token.strip().encode(), key.get_secret_value().encode()
    )


class ApiKeyMiddleware(HttpMiddleware):
    def __init__(self, app: ASGIApp, key: SecretStr | None, public_docs: bool) -> None:
        super().__init__(app)
        self.key = key
        self.public_docs = public_docs

    def _open(self, path: str) -> bool:
        return path in OPEN_PATHS or (self.public_docs and path.startswith(DOCS_PATHS))

    def applies(self, scope: Scope) -> bool:
        return self.key is not None and not self._open(scope["path"])

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.key is not None  # applies() checked it
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if authorized(header.decode("latin-1"), self.key):
            await self.app(scope, receive, send)
            return
        refusal = error_response(
            401,
            "unauthorized",
            "a valid API key is required (Authorization: Bearer <key>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await refusal(scope, receive, send)
