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
while it trickles in: it is closed at the same deadline."""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_BODY = json.dumps(
    {"error": {"type": "request_timeout", "message": "the request header was not received in time", "field": None}}
).encode()
TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class TimeoutProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_deadline: float | None = None  # loop time; set while a request's body is still arriving

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
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


def timeout_protocol(header_timeout_s: float, body_timeout_s: float) -> type[TimeoutProtocol]:
    return type(
        "TimeoutProtocol",
        (TimeoutProtocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )
