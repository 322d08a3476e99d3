"""SSE keep-alive around a chunk source: comments only while silent, chunks sent by the stream's own task,
errors passed on, the source closed."""

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.types import Message

from service.api.keepalive import KEEPALIVE, send_chunks


class Sent:
    """An ASGI `send` that records the bodies, and the task each was sent from."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.bodies: list[str] = []
        self.tasks: list[asyncio.Task[Any] | None] = []
        self.delay_s = delay_s

    async def __call__(self, message: Message) -> None:
        assert message["type"] == "http.response.body" and message["more_body"] is True
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # a slow client
        self.bodies.append(message["body"].decode())
        self.tasks.append(asyncio.current_task())


async def test_comments_only_while_silent_and_chunks_in_order() -> None:
    async def source() -> AsyncGenerator[str, None]:
        for i in range(20):
            yield f"fast {i}"  # back to back: no comment between these
        await asyncio.sleep(0.13)
        yield "slow"

    sent = Sent()
    await send_chunks(source(), sent, 0.05)
    out = sent.bodies
    assert out[:20] == [f"fast {i}" for i in range(20)] and out[-1] == "slow"
    assert 1 <= out.count(KEEPALIVE) <= 3 and len(out) == 21 + out.count(KEEPALIVE)
    chunk_tasks = {t for body, t in zip(out, sent.tasks, strict=True) if body != KEEPALIVE}
    assert chunk_tasks == {asyncio.current_task()}  # no reader task between the source and the socket


async def test_no_comment_when_off_or_while_a_send_is_under_way() -> None:
    async def source() -> AsyncGenerator[str, None]:
        yield "one"
        await asyncio.sleep(0.12)
        yield "two"

    off = Sent()
    await send_chunks(source(), off, 0)
    assert off.bodies == ["one", "two"]

    async def busy() -> AsyncGenerator[str, None]:
        yield "one"
        yield "two"

    slow = Sent(delay_s=0.15)  # each send outlasts the interval: the connection is busy, not idle
    await send_chunks(busy(), slow, 0.05)
    assert slow.bodies == ["one", "two"]


async def test_a_source_error_is_raised_to_the_sender() -> None:
    async def source() -> AsyncGenerator[str, None]:
        yield "one"
        raise ValueError("broken")

    sent = Sent()
    with pytest.raises(ValueError, match="broken"):
        await send_chunks(source(), sent, 1.0)
    assert sent.bodies == ["one"]


async def test_a_failed_comment_fails_the_stream() -> None:
    async def source() -> AsyncGenerator[str, None]:
        await asyncio.sleep(0.12)
        yield "late"

    async def broken(message: Message) -> None:
        raise OSError("connection reset")

    with pytest.raises(OSError, match="reset"):
        await send_chunks(source(), broken, 0.05)


async def test_leaving_early_closes_the_source() -> None:
    closed = asyncio.Event()
    sent = Sent()

    async def source() -> AsyncGenerator[str, None]:
        try:
            yield "one"
            await asyncio.sleep(60)  # a stream still waiting for its next token
            yield "never"
        finally:
            closed.set()

    stream = asyncio.ensure_future(send_chunks(source(), sent, 0.02))
    await asyncio.sleep(0.1)  # a comment or more went out meanwhile
    stream.cancel()  # the client went away
    await asyncio.gather(stream, return_exceptions=True)
    assert closed.is_set() and sent.bodies[0] == "one" and KEEPALIVE in sent.bodies


async def test_a_send_cut_off_closes_the_source() -> None:
    closed = asyncio.Event()

    async def source() -> AsyncGenerator[str, None]:
        try:
            yield "one"
            yield "two"
        finally:
            closed.set()

    stream = asyncio.ensure_future(send_chunks(source(), Sent(delay_s=60), 1.0))
    await asyncio.sleep(0.05)  # blocked sending "one", the source suspended at its yield
    stream.cancel()
    await asyncio.gather(stream, return_exceptions=True)
    assert closed.is_set()
