"""A decoder's key/value cache written in place: one slot per sequence, each of ``capacity`` positions.

Each layer's keys and values live in a buffer [slots, Hkv, capacity, Dh] that the decoder graph writes the
new tokens into at each row's own length (model/network/in_place.py): a decode step reads the cache and
writes one token's worth, and a sequence joining or leaving the batch copies nothing. A step runs over
the slots 0 .. high-water mark: slot-major buffers make that range one contiguous view.

The buffers are anonymous memory maps that reserve nothing: a page exists once a token is written to it,
so resident memory follows the tokens cached, not ``slots x capacity``, and a released slot's pages go
back to the OS at once (``madvise(MADV_DONTNEED)``). Admission keeps the tokens in use within
SERVE_KV_CACHE_BYTES (service/engine/cache/budget.py).
"""

from __future__ import annotations

import heapq
import mmap
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from contract.names import PAST, PRESENT
from service.engine.cache.appended import kv_names

MAP_NORESERVE = 0x4000  # Linux's flag (Python's mmap module does not name it): no swap reserved up front
FLOAT32 = np.dtype(np.float32)
CAPACITY_STEP = 256  # capacity is rounded up to it: a slot's bytes are then a whole number of pages


def bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int) -> int:
    """Bytes one cached token takes: a key and a value per layer and key/value head, float32 (docs/operations.md
    tables them per model)."""
    return 2 * n_layers * n_kv_heads * d_head * FLOAT32.itemsize


def _anonymous(nbytes: int) -> mmap.mmap:
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | MAP_NORESERVE
    return mmap.mmap(-1, nbytes, flags=flags)


class SlotBuffers:
    """One model's cache slots, used by its worker thread (acquire, run, release); a finalizer may release a
    dropped row's slot from another thread, hence the lock."""

    def __init__(self, n_layers: int, n_kv_heads: int, d_head: int, slots: int, capacity: int) -> None:
        capacity = -(-capacity // CAPACITY_STEP) * CAPACITY_STEP
        self.n_layers, self.slots, self.capacity = n_layers, slots, capacity
        self.shape = (slots, n_kv_heads, capacity, d_head)
        self.slot_bytes = n_kv_heads * capacity * d_head * FLOAT32.itemsize
        self._maps = [_anonymous(slots * self.slot_bytes) for _ in range(2 * n_layers)]
        self.buffers = [np.frombuffer(m, dtype=FLOAT32).reshape(self.shape) for m in self._maps]
        self.lengths = np.zeros(slots, dtype=np.int64)  # tokens written per slot
        self._free = list(range(slots))  # a heap: the lowest free slot first keeps the high-water mark low
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self.past_names = kv_names(PAST, n_layers)
        self.present_names = kv_names(PRESENT, n_layers)

    @property
    def in_use(self) -> int:
        return len(self._used)

    @property
    def cached_tokens(self) -> int:
        return int(self.lengths.sum())

    def acquire(self) -> int:
        """A free slot, emptied; IndexError when every slot is taken (admission keeps within the count)."""
        with self._lock:
            slot = heapq.heappop(self._free)
            self._used.add(slot)
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Free a slot (idempotent) and hand its pages back to the OS."""
        with self._lock:
            if slot not in self._used:
                return
            self._used.discard(slot)
            written = int(self.lengths[slot])
            self.lengths[slot] = 0
            heapq.heappush(self._free, slot)
        if written:
            for m in self._maps:
                m.madvise(mmap.MADV_DONTNEED, slot * self.slot_bytes, self.slot_bytes)

    def views(self, first: int, stop: int) -> list[np.ndarray]:
        """Every layer's buffers for slots first .. stop - 1 (contiguous views, no copy)."""
        return [b[first:stop] for b in self.buffers]


@dataclass(eq=False)
class SlotHold:
    """A sequence's slot, released once: when its row ends, or when the row is dropped unreleased (a failed
    step): the finalizer runs as the row is collected."""

    slot: int
    release: Callable[[], object] = field(repr=False)  # a weakref.finalize: it runs once

    @classmethod
    def take(cls, owner: object, buffers: SlotBuffers) -> SlotHold:
        slot = buffers.acquire()
        return cls(slot, weakref.finalize(owner, buffers.release, slot))
