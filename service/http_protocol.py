"""uvicorn's httptools protocol with a header-read timeout (SERVE_HEADER_TIMEOUT_S).

uvicorn closes idle keep-alive connections, but a client that opens a connection and sends nothing, or
sends its header one byte at a time, holds the connection (and a file descriptor) for as long as it likes:
the slowloris attack. Here the header of every request, the first one included, must be complete within
the timeout; otherwise the server answers 408 and closes the connection, as nginx does
(client_header_timeout). The body is bounded by SERVE_MAX_BODY_BYTES and SERVE_REQUEST_TIMEOUT_S."""

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


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its header was complete
        if not self.transport.is_closing():
            self.transport.write(TIMEOUT_RESPONSE)
            self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": seconds})
