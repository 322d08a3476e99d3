"""What `submit` returns: the event-loop side of one request's sequences.

The model's worker thread hands events over with one `call_soon_threadsafe` per step (scheduling/worker.py);
they land on the handle's queue, and the route reads them with `result()`/`results()` (the final event
of every sequence) or `events()`/`indexed_events()` (everything, as it comes). Leaving early, through
the deadline (SERVE_REQUEST_TIMEOUT_S) or because the client went away, cancels the sequences still
running, so they leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from service.engine.errors import EngineError, RequestTimeout

if TYPE_CHECKING:
    from service.engine.sequence import Sequence

E = TypeVar("E")  # a streamed event (a token)
R = TypeVar("R")  # a sequence's final event (its result)
T = TypeVar("T")

TIMEOUT = "the request did not finish within SERVE_REQUEST_TIMEOUT_S"


class Handle(Generic[E, R]):
    def __init__(
        self, model: str, sequences: list[Sequence], deadline: float | None, cancel: Callable[[list[Sequence]], None]
    ) -> None:
        self.model = model  # the served model's name
        self.sequences = sequences
        self.deadline = deadline  # time.monotonic(); None: no limit
        self.prompt_ids: list[list[int]] = []  # the tokenized inputs, one per input (not per sequence)
        self._cancel = cancel
        self._queue: asyncio.Queue[tuple[int, Any, bool] | EngineError] = asyncio.Queue()
        for index, seq in enumerate(sequences):
            seq.handle, seq.index = self, index

    # --- fed on the event loop by the scheduler ----------------------------------------------------

    def put(self, index: int, event: Any, final: bool) -> None:
        self._queue.put_nowait((index, event, final))

    def fail(self, error: EngineError) -> None:
        self._queue.put_nowait(error)

    # --- read by the route ---------------------------------------------------------------------------

    def cancel(self) -> None:
        """Drop every sequence that has not finished (idempotent)."""
        open_ = [s for s in self.sequences if not s.done]
        if open_:
            self._cancel(open_)

    async def _items(self) -> AsyncGenerator[tuple[int, Any, bool]]:
        remaining = len(self.sequences)
        # One timer for the whole request rather than a timeout per event: the deadline lands in the queue.
        timer = None
        if self.deadline is not None and remaining:
            delay = max(0.0, self.deadline - time.monotonic())
            timer = asyncio.get_running_loop().call_later(delay, self._queue.put_nowait, RequestTimeout(TIMEOUT))
        try:
            while remaining:
                item = await self._queue.get()
                if isinstance(item, EngineError):
                    raise item
                remaining -= item[2]
                yield item
        finally:
            if timer is not None:
                timer.cancel()
            self.cancel()

    def indexed_events(self) -> AsyncGenerator[tuple[int, E | R], None]:
        """(sequence index, event) for every sequence, as they come; each sequence ends with its result."""
        return self._each(lambda index, event: (index, event))

    def events(self) -> AsyncGenerator[E | R, None]:
        """The events of a one-sequence request, its result last."""
        assert len(self.sequences) == 1, "events() is for one sequence; use indexed_events()"
        return self._each(lambda _, event: event)

    async def _each(self, pick: Callable[[int, Any], T]) -> AsyncGenerator[T, None]:
        items = self._items()
        try:
            async for index, event, _ in items:
                yield pick(index, event)
        finally:  # a reader that leaves early (aclose) closes the inner generator now, not at collection
            await items.aclose()

    def results(self) -> Coroutine[Any, Any, list[R]]:
        """Every sequence's result, in submission order (an error of any of them is raised). Called, it
        tells the worker that nobody reads this request's token events: one hand-off to the event loop
        per request instead of one per token (a lone non-streamed generation paid one per step)."""
        for seq in self.sequences:
            seq.wants_events = False
        return self._results()

    async def _results(self) -> list[R]:
        results: list[Any] = [None] * len(self.sequences)
        async for index, event, final in self._items():  # errors arise inside, which closes it
            if final:
                results[index] = event
        return results

    async def result(self) -> R:
        (result,) = await self.results()
        return result
