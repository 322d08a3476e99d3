"""Dependencies shared by the routes: the engine from app.state, and cancel-on-disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from service.api.errors import ApiError
from service.engine.engine import Engine

T = TypeVar("T")


async def get_engine(request: Request) -> Engine:  # async: a sync dependency runs on a worker thread
    return request.app.state.engine  # type: ignore[no-any-return]


EngineDep = Annotated[Engine, Depends(get_engine)]


async def _disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect (or nothing, until the end).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it if the client goes away first (which frees its batch slot)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() or watcher.exception() is not None:  # a server that cannot tell: just wait
            return await task
        raise ApiError(499, "client_closed_request", "the client closed the connection")
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
