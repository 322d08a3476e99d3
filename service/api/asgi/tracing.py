"""Request ids and timing headers, as TGI and TEI send them.

`x-request-id`: the client's own (if it is a sane token) or a new one; echoed on every response and
put on every log line of the request. On inference responses: `x-queue-time` (waiting for a batch
slot), `x-inference-time` (admission to the response: the whole run, or the time to the first event
of a stream) and `x-total-time`, in milliseconds."""

from __future__ import annotations

import random
import re
import time

from starlette.types import Message, Receive, Scope, Send

from service.api.asgi.base import HttpMiddleware
from service.request_context import REQUEST_ID, TIMING, RequestTiming, new_timing

_SANE_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def new_request_id() -> str:
    """32 hex digits. An id names a request in logs and headers and guards nothing, so it needs no
    cryptographic source: os.urandom (secrets) is a system call that took ~8% of the event loop's time
    per classify request; the Mersenne Twister makes 128 bits in a fraction of that."""
    return f"{random.getrandbits(128):032x}"


def _ms(seconds: float) -> bytes:
    return str(max(0, round(seconds * 1000))).encode()


def timing_headers(timing: RequestTiming, now: float) -> list[tuple[bytes, bytes]]:
    headers = [(b"x-total-time", _ms(now - timing.started))]
    if timing.queued is not None and timing.admitted is not None:
        headers += [
            (b"x-queue-time", _ms(timing.admitted - timing.queued)),
            (b"x-inference-time", _ms(now - timing.admitted)),
        ]
    return headers


class RequestContextMiddleware(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = given if _SANE_ID.fullmatch(given) else new_request_id()
        timing = new_timing()
        id_token, timing_token = REQUEST_ID.set(request_id), TIMING.set(timing)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers += [(b"x-request-id", request_id.encode()), *timing_headers(timing, time.perf_counter())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        finally:
            REQUEST_ID.reset(id_token)
            TIMING.reset(timing_token)
