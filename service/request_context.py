"""Per-request context shared by the web layer, the engine and logging: the request id, and when the
request's work was queued and admitted (for the x-queue-time / x-inference-time headers).

Context variables follow the request into the tasks it starts; the engine records into the
`RequestTiming` object it finds there and knows nothing else about HTTP."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class RequestTiming:
    started: float  # time.perf_counter() when the request arrived
    queued: float | None = None  # first time some of its work entered a queue
    admitted: float | None = None  # last time some of its work left a queue for a model run

    def admit(self, enqueued: float, now: float) -> None:
        self.queued = enqueued if self.queued is None else min(self.queued, enqueued)
        self.admitted = now if self.admitted is None else max(self.admitted, now)


REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
TIMING: ContextVar[RequestTiming | None] = ContextVar("request_timing", default=None)


def current_timing() -> RequestTiming | None:
    return TIMING.get()


def new_timing() -> RequestTiming:
    return RequestTiming(time.perf_counter())
