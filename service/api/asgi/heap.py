"""Handing freed heap back to the OS after a burst of large requests (attention maps, long tokenizer inputs).

glibc keeps freed pages (and raises its mmap threshold after big frees); malloc_trim(0) returns them. It
walks the whole heap holding the allocator's locks, 20-130 ms measured, and the event loop's own mallocs
wait meanwhile: so it runs on a worker thread, once a burst is over, at most once per `interval_s`; never
after each request."""

from __future__ import annotations

import asyncio

from service.engine.heap_trim import release_memory


class HeapTrimmer:
    """`soon()` (on the event loop) schedules one trim: now, or `interval_s` after the last one. Asked again
    before it runs, it still runs once, so the last request of a burst always gets the memory back."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._last = float("-inf")
        self._scheduled: asyncio.TimerHandle | None = None
        self._running: asyncio.Future[None] | None = None

    def soon(self) -> None:
        if self._scheduled is not None:
            return
        loop = asyncio.get_running_loop()
        self._scheduled = loop.call_later(max(0.0, self._last + self.interval_s - loop.time()), self._start)

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._running is not None and not self._running.done():  # one at a time: look again later
            self._scheduled = loop.call_later(self.interval_s, self._start)
            return
        self._scheduled = None
        self._last = loop.time()
        self.trims += 1
        self._running = asyncio.ensure_future(asyncio.to_thread(release_memory))
