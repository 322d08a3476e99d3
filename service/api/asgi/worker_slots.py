"""Bounded work off the event loop: at most `workers` calls run on worker threads at once, at most
`max_waiting` more wait for a slot, and beyond that the request is refused (429, Retry-After), so a burst
of large inputs neither stalls the event loop (/health, streams) nor piles up without end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from service.api.asgi.heap import HeapTrimmer
from service.api.errors import ApiError

T = TypeVar("T")


class WorkerSlots:
    def __init__(self, workers: int, max_waiting: int, what: str) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self.what = what  # "tokenizer work", in the refusal
        self.running = 0
        self.waiting = 0
        self.trimmer = HeapTrimmer()
        self._free: asyncio.Semaphore | None = None  # made on first use, in the serving loop
        self._large = False  # some work since the last trim had a large input

    async def run(self, fn: Callable[[], T], large: bool = False) -> T:
        """`fn()` on a worker thread. `large`: its input was large, so once no work is left the heap it
        freed goes back to the OS."""
        free = self._free = self._free or asyncio.Semaphore(self.workers)
        if free.locked() and self.waiting >= self.max_waiting:
            raise ApiError(
                429,
                "queue_full",
                f"too much {self.what} waiting ({self.waiting} requests); retry",
                headers={"Retry-After": "1"},
            )
        self.waiting += 1
        try:
            await free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self._large |= large
        # The slot is freed when the thread is done, not when the request is: a client that hangs up does not
        # let more threads run than `workers`.
        work = asyncio.ensure_future(asyncio.to_thread(fn))
        work.add_done_callback(lambda done: self._done(free, done))
        return await asyncio.shield(work)

    def _done(self, free: asyncio.Semaphore, work: asyncio.Future[T]) -> None:
        self.running -= 1
        free.release()
        if not work.cancelled():
            work.exception()  # retrieved: no "never retrieved" warning when the caller has gone
        if self._large and not self.running and not self.waiting:
            self._large = False
            self.trimmer.soon()
