"""Handing the memory a burst used back to the OS once the engine is idle again (SERVE_MEMORY_TRIM_IDLE_S).

ONNX Runtime's CPU arena grows to the largest batch yet and never shrinks; so with the trim on, sessions
run without it (service/runtime/sessions.py) and a run's tensors go back to malloc as it returns. glibc
then keeps them (`hold_freed_memory`) for the next runs, and malloc_trim(0) hands them to the OS once
every model's worker has been idle for `delay_s`. The trim walks every malloc arena holding its lock
(tens of ms after a burst), so it runs on a worker thread, once per idle period: never per request, never
on the event loop, and not while requests keep arriving closer together than `delay_s`."""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

_libc = ctypes.CDLL(None)
_malloc_trim = getattr(_libc, "malloc_trim", None)  # glibc's; not in musl, macOS, or a preloaded jemalloc
_mallopt = getattr(_libc, "mallopt", None)
TRIM_AVAILABLE = _malloc_trim is not None and _mallopt is not None

# mallopt's parameters (glibc's malloc.h) and glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
# Past the peak of any burst: glibc gives nothing back by itself, the idle trim does. (64 MB, which would
# leave the event loop's heap trimming its top as it goes, faulted 2-3x the pages of a burst of 96
# generations: threads beyond glibc's arena count share the main heap.)
TRIM_THRESHOLD = 1 << 30


def release_memory() -> None:
    """malloc_trim(0): every arena's free pages back to the OS."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def hold_freed_memory() -> bool:
    """glibc's defaults give a heap's free top back to the OS at once (past 128 KB at first), and serve blocks
    past a threshold it moves with each free by mmap: without the arena, a decode step of 96 rows x 200 positions
    faulted 16,868 pages (66 MB) back in every step. Fixed thresholds keep blocks up to 32 MB on the heap,
    freed ones kept for the next runs until the idle trim. Process-wide: call it in the engine's process,
    whose models run on threads of their own."""
    if _mallopt is None:
        return False
    return bool(_mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(_mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


class IdleTrim:
    """Counts the models' workers that have work; `delay_s` after the last one goes idle, once work ran since
    the previous trim, calls `release` on a worker thread. `busy` and `idle` run on the event loop (each
    worker hands them over with call_soon_threadsafe as it wakes with work and as it runs out)."""

    def __init__(self, delay_s: float, release: Callable[[], object] = release_memory) -> None:
        self.delay_s = delay_s
        self.release = release
        self.trims = 0
        self._busy: set[str] = set()
        self._worked = False  # work ran since the last trim
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Future[object] | None = None

    def busy(self, worker: str) -> None:
        self._busy.add(worker)
        self._worked = True
        if self._timer is not None:  # not idle after all
            self._timer.cancel()
            self._timer = None

    def idle(self, worker: str) -> None:
        self._busy.discard(worker)
        if not self._busy and self._worked and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._trim)

    def _trim(self) -> None:
        self._timer = None
        if self._running is not None and not self._running.done():  # the last one still runs: look again later
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._trim)
            return
        self._worked = False
        self.trims += 1
        self._running = asyncio.ensure_future(asyncio.to_thread(self.release))
