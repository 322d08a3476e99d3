"""The link between a front-end process and the engine process: one Unix socket pair per front end,
carrying batches of messages as length-prefixed pickles.

Each side queues its messages and sends them once per event-loop iteration, in one frame: a step's
events for every request of a front end are one write and one read, however many streams they feed.
Both processes are the same program forked from one parent, so pickle is safe here: nothing else can
connect to a socket pair.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
from collections.abc import Callable
from typing import Any, Final, cast

log = logging.getLogger(__name__)

Message = tuple[Any, ...]  # (tag, ...): the tags and their fields are listed at the end of this module
LENGTH = 4  # bytes of each frame's length prefix
BYTE_ORDER: Final = "little"


def frame(messages: list[Message]) -> bytes:
    data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(LENGTH, BYTE_ORDER) + data


class Link(asyncio.Protocol):
    """One end of a front end's socket pair: `send` queues a message; `on_message` gets each one received,
    in order; `on_lost` is called once when the other process is gone."""

    def __init__(self, on_message: Callable[[Message], None], on_lost: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._outbox: list[Message] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @classmethod
    async def open(
        cls, sock: socket.socket, on_message: Callable[[Message], None], on_lost: Callable[[], None]
    ) -> Link:
        """Serve `sock` (one end of a connected socket pair) on the running loop."""
        loop = asyncio.get_running_loop()
        _, link = await loop.create_unix_connection(lambda: cls(on_message, on_lost), sock=sock)
        return link

    # --- asyncio.Protocol ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        start = 0
        while len(self._buffer) - start >= LENGTH:
            size = int.from_bytes(self._buffer[start : start + LENGTH], BYTE_ORDER)
            end = start + LENGTH + size
            if len(self._buffer) < end:
                break
            messages: list[Message] = pickle.loads(self._buffer[start + LENGTH : end])
            start = end
            for message in messages:
                try:
                    self.on_message(message)
                except Exception:  # one bad message must not take the link (and every request on it) down
                    log.exception("a message from the other process failed: %r", message[0])
        del self._buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self.on_lost()

    # --- sending -----------------------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Queue `message`; everything queued in this loop iteration goes out in one frame, pickled then
        (so a request's sequences are read as they are when the iteration ends)."""
        if self.closed:
            return
        if not self._outbox:
            assert self._loop is not None
            self._loop.call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if self._transport is not None and not self.closed:
            self._transport.write(frame(messages))

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


# A front end's messages to the engine process.
SUBMIT = "submit"  # (SUBMIT, request id, model, sequences, field): queue a request's sequences, all or none
CANCEL = "cancel"  # (CANCEL, request id): the client went away or the deadline passed
SCORE = "score"  # (SCORE, request id, model, prompts, top_k, deadline): score prompt tokens
UNSCORE = "unscore"  # (UNSCORE, request id): the scoring's request is gone
# The engine process's messages to a front end.
EVENT = "event"  # (EVENT, request id, sequence index, event, final, admitted time or None)
FAILED = "failed"  # (FAILED, request id, EngineError): the request's open sequences end with this error
SCORED = "scored"  # (SCORED, request id, scores or an exception)
STATE = "state"  # (STATE, ready, failure or None): the engine process is warm, or failed to be
