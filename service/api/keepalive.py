"""SSE keep-alive: a comment line (`: keep-alive`) whenever a stream has been silent for a while, so
proxies and load balancers with idle timeouts do not cut a long prefill or a slow queue. Clients ignore
comment lines (the SSE spec)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

KEEPALIVE = ": keep-alive\n\n"
_END = object()


async def with_keepalive(chunks: AsyncIterator[str], interval_s: float) -> AsyncIterator[str]:
    """One reader task and one re-arming timer per stream, not a task and a timeout per chunk: with 16
    streams a chunk per decode step each, that per-chunk work was the event loop's own share of the CPU."""
    if interval_s <= 0:
        async for chunk in chunks:
            yield chunk
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    last = time.monotonic()

    async def read() -> None:
        nonlocal last
        try:
            async for chunk in chunks:
                last = time.monotonic()
                queue.put_nowait(chunk)
        except BaseException as exc:  # the source's error goes out where the chunks do
            queue.put_nowait(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            queue.put_nowait(_END)

    def tick() -> None:
        nonlocal timer, last
        now = time.monotonic()
        if now - last >= interval_s:
            queue.put_nowait(KEEPALIVE)  # the read carries on; only a comment goes out
            last = now
        timer = loop.call_later(interval_s - (now - last), tick)

    reader = asyncio.ensure_future(read())
    timer = loop.call_later(interval_s, tick)
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:  # the client went away (or the stream ended): stop the read and close the source
        timer.cancel()
        if not reader.done():
            reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await chunks.aclose()  # type: ignore[attr-defined]
