"""What the scheduler schedules, and the two small interfaces a model plugs in through (after TGI's
batch state): `prefill(sequences)` builds a batch for newcomers (a one-step model, the classifier, emits
every result there and returns no batch), and a batch has `step()`, `filter()` and `concatenate()`. A
model whose prompts can join a running batch a chunk per step also has `start_prefill`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from service.request_context import current_timing

if TYPE_CHECKING:
    from service.engine.handle import Handle


class Sequence:
    """One scheduled sequence. `rows` is how many batch rows it may occupy (1, or the number of beams)."""

    def __init__(self, rows: int = 1, prefill_tokens: int = 1) -> None:
        self.rows = rows
        self.prefill_tokens = prefill_tokens  # its length in the padded prefill batch
        self.cache_tokens = 0  # the most key/value cache positions it may fill (0: not counted against a budget)
        self.enqueued = time.perf_counter()
        self.admitted: float | None = None  # when it left the queue for its prefill
        self.cancelled = False  # set on the loop, read by the worker between steps
        self.wants_events = True  # False once its handle is read for results only: no token events to hand over
        self.done = False  # its final event (or an error) was delivered; loop side
        self.timing = current_timing()  # the HTTP request's timing record, if any
        self.handle: Handle[Any, Any] | None = None
        self.index = 0  # its position in the handle

    def __getstate__(self) -> dict[str, Any]:
        """What crosses from a front-end process to the engine's (service/multiprocess): the sequence's
        own data, not its handle nor the HTTP request's timing record (they stay with the front end)."""
        return self.__dict__ | {"handle": None, "timing": None}


SeqT = TypeVar("SeqT", bound=Sequence)


@dataclass
class Emit:
    """An event for one sequence, produced in the worker thread; `final` ends the sequence."""

    sequence: Sequence
    event: Any
    final: bool = False


class DecodeBatch(Protocol[SeqT]):
    @property
    def sequences(self) -> list[SeqT]: ...

    @property
    def rows(self) -> int: ...

    def step(self) -> list[Emit]:
        """Run one decode step for every row; afterwards the batch holds only unfinished sequences."""
        ...

    def filter(self, keep: list[SeqT]) -> DecodeBatch[SeqT] | None: ...

    def concatenate(self, other: DecodeBatch[SeqT]) -> DecodeBatch[SeqT]: ...


class DecodeModel(Protocol[SeqT]):
    def prefill(self, sequences: list[SeqT]) -> tuple[list[Emit], DecodeBatch[SeqT] | None]: ...


@runtime_checkable
class CacheBudgeted(Protocol):
    """A model whose sequences' key/value caches share a memory budget (service/engine/cache/budget.py)."""

    @property
    def cache_budget(self) -> int | None:
        """The budget in bytes, None where there is none."""
        ...

    def cache_cost(self, seq: Sequence) -> int:
        """The bytes a sequence may fill at most."""
        ...

    def cache_room(self, running: Iterable[Sequence], wanted: int) -> int:
        """The bytes free beside the running sequences, after freeing up to `wanted` bytes of idle cache."""
        ...

    def cache_usage(self) -> float:
        """The share of the budget holding keys and values now."""
        ...


class PromptChunks(Protocol[SeqT]):
    """Newcomers' prompts being fed a chunk per step; the last chunk gives what `prefill` gives."""

    @property
    def sequences(self) -> list[SeqT]: ...

    def advance(self, max_tokens: int | None) -> tuple[list[Emit], DecodeBatch[SeqT] | None] | None: ...


@runtime_checkable
class ChunkedPrefillModel(DecodeModel[SeqT], Protocol[SeqT]):
    """A model whose prompts can join a running batch a chunk per step (the generator)."""

    def start_prefill(self, sequences: list[SeqT]) -> PromptChunks[SeqT]: ...
