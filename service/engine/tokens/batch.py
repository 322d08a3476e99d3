"""The part of a decode batch that generation and translation share: one entry per sequence (a
generation row, a translation request), from which the scheduler's `sequences` and `filter` follow, and
the decode state every autoregressive batch carries from step to step, kept or joined the same way."""

from __future__ import annotations

from typing import Generic, Protocol, Self, TypedDict, TypeVar

import numpy as np

from service.engine.cache.appended import KVCache
from service.engine.sequence import Sequence
from service.engine.tokens.chooser import ChooserRows
from service.engine.tokens.stopping import StopRows


class DecodeState(TypedDict):
    """Keyword arguments of both batches' constructors."""

    cache: KVCache | None  # per row; None where each row holds a slot of an in-place cache (cache/slots.py)
    next_ids: np.ndarray  # [rows, 1]: the token each row feeds next
    chooser: ChooserRows  # per row that chooses its own token (translation: per num_beams=1 request)
    stops: StopRows  # as chooser


class _Entry(Protocol):
    @property
    def seq(self) -> Sequence: ...


E = TypeVar("E", bound=_Entry)


class SequenceBatch(Generic[E]):
    """Subclasses give their `entries` (in batch order), `_take` (the batch of some of them) and the
    DecodeState attributes."""

    cache: KVCache | None
    next_ids: np.ndarray
    chooser: ChooserRows
    stops: StopRows

    @property
    def entries(self) -> list[E]:
        raise NotImplementedError

    def _take(self, indices: list[int]) -> Self | None:
        raise NotImplementedError

    @property
    def sequences(self) -> list[Sequence]:
        return [e.seq for e in self.entries]

    @property
    def rows(self) -> int:
        """Batch rows: one per entry, unless an entry takes several (beams)."""
        return len(self.entries)

    def filter(self, keep: list[Sequence]) -> Self | None:
        """The entries whose sequence is in `keep` (the others were cancelled or timed out), or None."""
        wanted = {id(s) for s in keep}
        return self._take([i for i, e in enumerate(self.entries) if id(e.seq) in wanted])

    def _state_of(self, rows: np.ndarray, choosing: np.ndarray) -> DecodeState:
        """The decode state of some batch rows, and of some of the rows that choose their own token."""
        return DecodeState(
            cache=self.cache.take(rows) if self.cache is not None else None,
            next_ids=self.next_ids[rows],
            chooser=self.chooser.take(choosing),
            stops=self.stops.take(choosing),
        )

    def _state_with(self, other: SequenceBatch[E]) -> DecodeState:
        """The decode state of this batch's rows followed by `other`'s."""
        return DecodeState(
            cache=None if self.cache is None or other.cache is None else KVCache.concat([self.cache, other.cache]),
            next_ids=np.concatenate([self.next_ids, other.next_ids]),
            chooser=ChooserRows.concat([self.chooser, other.chooser]),
            stops=StopRows.concat([self.stops, other.stops]),
        )
