"""The server's app in-process, for measuring what users get: its real lifespan (start-up checks, warm
engine), routes and engine behind an httpx client on the ASGI app (no socket). Shared by the card
examples (scripts/card_examples.py) and the translator's evaluation (scripts/evaluate_translation.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx


@asynccontextmanager
async def served_client(base_url: str, request_timeout: float, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app built from ``Settings(**settings)``, once its engine is ready."""
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(**settings))
    async with app.router.lifespan_context(app):
        while not app.state.engine.ready:
            if app.state.engine.failure:
                raise RuntimeError(app.state.engine.failure)
            await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url, timeout=request_timeout) as client:
            yield client
