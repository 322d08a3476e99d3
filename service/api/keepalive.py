"""SSE keep-alive: a comment line (`: keep-alive`) whenever a stream has been silent for a while, so
proxies and load balancers with idle timeouts do not cut a long prefill or a slow queue. Clients ignore
comment lines (the SSE spec)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from starlette.types import Send

KEEPALIVE = ": keep-alive\n\n"


async def send_chunks(chunks: AsyncGenerator[str, None], send: Send, interval_s: float) -> None:
    """Send every chunk as an ASGI body message (more to come), and KEEPALIVE whenever the source has been
    silent for `interval_s` (0: never). The response's own task reads the source and sends: a reader task
    and a queue in between cost the event loop a second task wake-up per token. A comment is sent by a
    short task that the one re-arming timer starts, once per silent interval; the next chunk waits for it."""
    loop = asyncio.get_running_loop()
    last = time.monotonic()  # when the source last gave a chunk
    sending = False  # a send is under way (a slow client): the connection is not idle, no comment
    comment: asyncio.Task[None] | None = None  # on its way; one that failed stays, for the stream to raise
    timer: asyncio.TimerHandle | None = None

    async def put(chunk: str) -> None:
        nonlocal sending
        sending = True
        try:
            await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
        finally:
            sending = False

    async def keep_alive() -> None:
        nonlocal comment
        await put(KEEPALIVE)
        comment = None

    def tick() -> None:
        nonlocal timer, last, comment
        now = time.monotonic()
        if now - last >= interval_s:
            if not sending and comment is None:
                comment = asyncio.ensure_future(keep_alive())
            last = now
        timer = loop.call_later(interval_s - (now - last), tick)

    if interval_s > 0:
        timer = loop.call_later(interval_s, tick)
    try:
        async for chunk in chunks:
            last = time.monotonic()
            if comment is not None:  # the comment goes out first
                await comment
            await put(chunk)
        if comment is not None:
            await comment
    finally:  # the client went away (or the stream ended): stop the timer and close the source
        if timer is not None:
            timer.cancel()
        if comment is not None:
            comment.cancel()
            await asyncio.gather(comment, return_exceptions=True)
        await chunks.aclose()
