"""Large JSON responses (attention maps): serialized on a worker thread, not the event loop, so /health and
the other requests keep being answered; the heap is handed back to the OS once the body is sent."""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

from fastapi.responses import Response
from pydantic import BaseModel
from starlette.background import BackgroundTask


def _malloc_trim() -> Callable[[], object]:
    """glibc keeps freed heap pages (and raises its mmap threshold after big frees): malloc_trim(0) returns
    them. Elsewhere (musl, macOS) there is nothing to call."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return (lambda: trim(0)) if trim is not None else (lambda: None)


release_memory = _malloc_trim()


async def large_json(model: BaseModel) -> Response:
    body = await asyncio.to_thread(model.model_dump_json, exclude_none=True)
    return Response(body, media_type="application/json", background=BackgroundTask(release_memory))
