"""SSE keep-alive around a chunk source: comments only while silent, errors passed on, the source closed."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.api.keepalive import KEEPALIVE, with_keepalive


async def test_comments_only_while_silent_and_chunks_in_order() -> None:
    async def source() -> AsyncIterator[str]:
        for i in range(20):
            yield f"fast {i}"  # back to back: no comment between these
        await asyncio.sleep(0.13)
        yield "slow"

    out = [chunk async for chunk in with_keepalive(source(), 0.05)]
    assert out[:20] == [f"fast {i}" for i in range(20)] and out[-1] == "slow"
    assert 1 <= out.count(KEEPALIVE) <= 3 and len(out) == 21 + out.count(KEEPALIVE)


async def test_a_source_error_is_raised_to_the_reader() -> None:
    async def source() -> AsyncIterator[str]:
        yield "one"
        raise ValueError("broken")

    stream = with_keepalive(source(), 1.0)
    assert await anext(stream) == "one"
    with pytest.raises(ValueError, match="broken"):
        await anext(stream)


async def test_leaving_early_closes_the_source() -> None:
    closed = asyncio.Event()

    async def source() -> AsyncIterator[str]:
        try:
            yield "one"
            await asyncio.sleep(60)  # a stream still waiting for its next token
            yield "never"
        finally:
            closed.set()

    stream = with_keepalive(source(), 1.0)
    assert await anext(stream) == "one"
    await stream.aclose()  # the client went away
    assert closed.is_set()
