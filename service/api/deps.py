"""Dependencies shared by the routes: the engine from app.state, and cancel-on-disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from service.api.errors import ApiError
from service.engine.engine import Engine

T = TypeVar("T")


async def get_engine(request: Request) -> Engine:  # async: a sync dependency runs on a worker thread
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


async def _watch(request: Request, on_disconnect: Callable[[], None]) -> None:
    # The body is already read, so the next ASGI message is the disconnect (or nothing, until the end).
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a server that cannot tell: the work just runs to its end
        return
    on_disconnect()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it if the client goes away first (which frees its batch slot). One watcher
    task cancels this one: a task for the work and an asyncio.wait cost ~60 us per request on top."""
    current = asyncio.current_task()
    assert current is not None
    gone = False

    def on_disconnect() -> None:
        nonlocal gone
        gone = True
        current.cancel()

    watcher = asyncio.ensure_future(_watch(request, on_disconnect))
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        current.uncancel()
        raise ApiError(499, "client_closed_request", "the client closed the connection") from None
    finally:
        watcher.cancel()
