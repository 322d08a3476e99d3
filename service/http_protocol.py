"""uvicorn's httptools protocol with the transport's timeouts: the header (SERVE_HEADER_TIMEOUT_S) and
the body (SERVE_BODY_TIMEOUT_S) of a request.

uvicorn closes idle keep-alive connections (SERVE_KEEPALIVE_TIMEOUT_S), but a client that opens a
connection and sends nothing, or sends its header one byte at a time, holds the connection (and a file
descriptor) for as long as it likes: the slowloris attack. Here the header of every request, the first one
included, must be complete within the timeout; otherwise the server answers 408 and closes the connection,
as nginx does (client_header_timeout).

The body must then arrive whole within SERVE_BODY_TIMEOUT_S. The app reads it through BodyLimitMiddleware,
which answers a late body with 408 (in the API's error shape, counted and logged like any answer) and so
frees the request's in-flight slot; here the connection is marked to close after that answer. A body that
no handler reads (the request was answered without it: 401, 404, 413) would otherwise hold the connection
while it trickles in: it is closed at the same deadline.

A response's sends must each complete within SERVE_SEND_TIMEOUT_S. uvicorn's send waits while the
transport's write buffer is above its high-water mark: a client that stops reading an event stream would
hold its connection and its in-flight slot for good. Only that wait is timed, so a send that does not wait
costs nothing more; when the timeout passes, the connection is aborted, which ends the request as a client
that went away would (the engine stops its work, its slot is freed)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import cast

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger(__name__)

_BODY = json.dumps(
    {"error": {"type": "request_timeout", "message": "the request header was not received in time", "field": None}}
).encode()
TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class SendTimeoutFlow(FlowControl):
    """uvicorn's flow control, whose drain (awaited by a send only while writing is paused) gives up after
    `timeout_s`: the connection is then aborted. It runs in the task of the send that waits, so its log
    line carries that request's id. A send that does not wait never gets here: measured under uvloop, an
    SSE token's send costs 0.37 us, as with uvicorn's own flow control (0.36 us); an asyncio.timeout
    around every send would cost 5.1 us more, an asyncio.wait_for 5.5 us."""

    def __init__(self, transport: asyncio.Transport, timeout_s: float) -> None:
        super().__init__(transport)
        self.timeout_s = timeout_s
        self.what = "a response"  # the request answering ("POST /v1/generate"), for the log line
        self.cut = False

    async def drain(self) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._is_writable_event.wait()
            return
        except TimeoutError:
            pass
        if not self.cut:  # once: another send waiting on the same buffer times out with it
            self.cut = True
            log.warning(
                "%s: a send waited %g s for the client to read (SERVE_SEND_TIMEOUT_S); closing the connection",
                self.what,
                self.timeout_s,
            )
        self._transport.abort()  # also when a close is under way: close() would wait for the unread buffer
        # connection_lost (soon after the abort) marks the request disconnected and sets the event: the send
        # then returns without writing, and the app's disconnect listener ends the request.
        await self._is_writable_event.wait()


class TimeoutProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    send_timeout_s = 60.0
    _send_flow: SendTimeoutFlow
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_deadline: float | None = None  # loop time; set while a request's body is still arriving

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # a stream server's transport (uvicorn's own annotation)
        super().connection_made(stream)
        self.flow = self._send_flow = SendTimeoutFlow(stream, self.send_timeout_s)  # cycles take it from here
        self._arm_header()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Armed only when a body outlasts the bytes at hand: most bodies arrive with their header.
        if self._body_deadline is not None and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header()

    def on_headers_complete(self) -> None:
        self._disarm_header()
        self._body_deadline = self.loop.time() + self.body_timeout_s
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm_body()
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        # The request now answering (a pipelined one starts when the one before it is answered).
        self._send_flow.what = f"{cycle.scope['method']} {cycle.scope['path']}"
        super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header()
        self._disarm_body()
        super().connection_lost(exc)

    def _arm_header(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm_header(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _disarm_body(self) -> None:
        self._body_deadline = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its header was complete
        if not self.transport.is_closing():
            self.transport.write(TIMEOUT_RESPONSE)
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        self._body_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # answered without its body: nothing more to say
            self.transport.close()
        else:  # the app's own deadline answers 408 (BodyLimitMiddleware): the connection ends with it
            self.cycle.keep_alive = False


def timeout_protocol(
    header_timeout_s: float, body_timeout_s: float, send_timeout_s: float = 60.0
) -> type[TimeoutProtocol]:
    timeouts = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "send_timeout_s": send_timeout_s,
    }
    return type("TimeoutProtocol", (TimeoutProtocol,), timeouts)
