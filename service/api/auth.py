"""Optional bearer-token authentication (SERVE_API_KEY; off when unset)."""

from __future__ import annotations

import secrets

from fastapi import Request

from service.api.errors import ApiError


async def require_api_key(request: Request) -> None:
    key = request.app.state.settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        token.strip().encode(), key.get_secret_value().encode()
    ):
        raise ApiError(
            401,
            "unauthorized",
            "a valid API key is required (Authorization: Bearer <key>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
