"""SSE keep-alive: a comment line (`: keep-alive`) whenever a stream has been silent for a while, so
proxies and load balancers with idle timeouts do not cut a long prefill or a slow queue. Clients ignore
comment lines (the SSE spec)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

KEEPALIVE = ": keep-alive\n\n"


async def with_keepalive(chunks: AsyncIterator[str], interval_s: float) -> AsyncIterator[str]:
    if interval_s <= 0:
        async for chunk in chunks:
            yield chunk
        return
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(chunks))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield KEEPALIVE  # the pending read carries on; only a comment goes out
                continue
            finished, pending = pending, None
            try:
                chunk = finished.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:  # the client went away (or the stream ended): stop the read and close the source
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await chunks.aclose()  # type: ignore[attr-defined]
