"""Continuous batching (as in TGI / vLLM): new sequences join the running batch at the next step, finished
and abandoned ones leave, each keeping its own KV cache rows.

A model plugs in through two small interfaces, after TGI's batch state: `prefill(sequences)` builds a
batch for newcomers, and a batch has `step()`, `filter()` and `concatenate()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from service.engine.errors import EngineError, InferenceFailed, InvalidInput, QueueFull, RequestTimeout
from service.engine.metrics import Metrics
from service.request_context import current_timing
from service.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Prefill computes logits at every prompt position ([B, S, V] floats): cap B * S per prefill call.
MAX_PREFILL_TOKENS = 4096


async def collect(coroutines: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Await all, in order; on the first error (or if we are cancelled) cancel the rest and raise."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
            # The other sequences of a failed batch fail too; one error is enough.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


@dataclass
class Failure:
    error: EngineError


class Sequence:
    """One scheduled sequence, seen from the event loop: its events arrive on `events`.

    `rows` is how many batch rows it may occupy (1, or the number of beams)."""

    def __init__(self, rows: int = 1, prefill_tokens: int = 1) -> None:
        self.rows = rows
        self.prefill_tokens = prefill_tokens  # its length in the padded prefill batch
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.enqueued = time.perf_counter()
        self.cancelled = False  # set on the loop, read by the worker between steps
        self.done = False
        self.timing = current_timing()  # the HTTP request's timing record, if any
        self.admitted: float | None = None  # when it left the queue for its prefill

    def cancel(self) -> None:
        self.cancelled = True

    async def stream(self, deadline: float | None = None) -> AsyncIterator[Any]:
        """Yield events until the final one; raise the engine error of a failed batch, or RequestTimeout.
        Leaving early (client gone, timeout) cancels the sequence so it frees its slot at the next step."""
        try:
            while True:
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    raise RequestTimeout("the request did not finish within SERVE_REQUEST_TIMEOUT_S")
                try:
                    event = await asyncio.wait_for(self.events.get(), timeout)
                except TimeoutError:
                    raise RequestTimeout("the request did not finish within SERVE_REQUEST_TIMEOUT_S") from None
                if isinstance(event, Failure):
                    raise event.error
                yield event
                if self.done and self.events.empty():
                    return
        finally:
            if not self.done:
                self.cancel()


@dataclass
class Emit:
    """An event for one sequence, produced in the worker thread; `final` ends the sequence."""

    sequence: Sequence
    event: Any
    final: bool = False


class DecodeBatch(Protocol):
    @property
    def sequences(self) -> list[Sequence]: ...

    @property
    def rows(self) -> int: ...

    def step(self) -> list[Emit]:
        """Run one decode step for every row; afterwards the batch holds only unfinished sequences."""
        ...

    def filter(self, keep: list[Sequence]) -> DecodeBatch | None: ...

    def concatenate(self, other: DecodeBatch) -> DecodeBatch: ...


class DecodeModel(Protocol):
    def prefill(self, sequences: list[Sequence]) -> tuple[list[Emit], DecodeBatch | None]: ...


class Scheduler:
    def __init__(
        self,
        name: str,
        model: DecodeModel,
        *,
        max_rows: int,
        max_queue_size: int,
        max_wait_s: float,
        executor: Executor,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.model = model
        self.max_rows = max_rows
        self.max_queue_size = max_queue_size
        self.max_wait_s = max_wait_s
        self.executor = executor
        self.metrics = metrics
        self._waiting: deque[Sequence] = deque()
        self._prefilling: list[Sequence] = []
        self._batch: DecodeBatch | None = None
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(
        cls, name: str, model: DecodeModel, settings: Settings, executor: Executor, metrics: Metrics
    ) -> Scheduler:
        return cls(
            name,
            model,
            max_rows=settings.max_batch_size,
            max_queue_size=settings.max_queue_size,
            max_wait_s=settings.max_wait_ms / 1000,
            executor=executor,
            metrics=metrics,
        )

    @property
    def running(self) -> int:
        return 0 if self._batch is None else len(self._batch.sequences)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"scheduler-{self.name}")

    async def stop(self, error: EngineError) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        running = self._batch.sequences if self._batch else []
        self._fail([*self._waiting, *self._prefilling, *running], error)
        self._waiting.clear()
        self._batch = None
        self._set_gauges()

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue all sequences or none; 429 the same way for one and for many."""
        for seq in sequences:
            if seq.rows > self.max_rows:
                raise InvalidInput(f"needs {seq.rows} batch rows but SERVE_MAX_BATCH_SIZE is {self.max_rows}")
        if len(self._waiting) + len(sequences) > self.max_queue_size:
            self.metrics.rejected.labels(self.name, "queue_full").inc()
            raise QueueFull(f"{self.name}: queue is full ({len(self._waiting)} waiting, limit {self.max_queue_size})")
        self._waiting.extend(sequences)
        self._set_gauges()
        self._arrived.set()

    async def _loop(self) -> None:
        """Schedule -> run one step -> update and emit tokens, for as long as there is work."""
        while True:
            await self._wait_for_work()
            newcomers = self._admit()
            if newcomers:
                await self._prefill(newcomers)
            if self._batch is not None:
                await self._decode()
            self._set_gauges()

    async def _wait_for_work(self) -> None:
        """Block while idle; when a first sequence arrives at an idle batch, give others max_wait_s to join
        it so their prefill runs as one batch."""
        if self._batch is not None:
            return
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = self._waiting[0].enqueued + self.max_wait_s
        while sum(s.rows for s in self._waiting) < self.max_rows:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _admit(self) -> list[Sequence]:
        """Move waiting sequences into the batch while their rows fit (first come, first served), and
        while the padded prefill stays within MAX_PREFILL_TOKENS."""
        free = self.max_rows - (self._batch.rows if self._batch else 0)
        admitted: list[Sequence] = []
        longest = 0
        now = time.perf_counter()
        while self._waiting and (self._waiting[0].cancelled or self._waiting[0].rows <= free):
            seq = self._waiting[0]
            padded = max(longest, seq.prefill_tokens) * (len(admitted) + 1)
            if admitted and not seq.cancelled and padded > MAX_PREFILL_TOKENS:
                break
            self._waiting.popleft()
            if seq.cancelled:
                self.metrics.cancelled.labels(self.name).inc()
                continue
            longest = max(longest, seq.prefill_tokens)
            free -= seq.rows
            self.metrics.queue_time.labels(self.name).observe(now - seq.enqueued)
            admitted.append(seq)
            seq.admitted = now
            if seq.timing is not None:
                seq.timing.admit(seq.enqueued, now)
        return admitted

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _prefill(self, newcomers: list[Sequence]) -> None:
        self.metrics.batch_size.labels(self.name, "prefill").observe(sum(s.rows for s in newcomers))
        self._prefilling = newcomers  # stop() fails them if it cancels us mid-call
        try:
            emits, batch = await self._call(self._prefill_and_join, newcomers)
        except Exception as exc:  # the running batch is untouched: concatenate builds a new one
            self._prefilling = []
            if len(newcomers) > 1:  # find the row at fault: prefill each alone, so only its request fails
                for seq in newcomers:
                    await self._prefill([seq])
                return
            self._fail(newcomers, exc)
            return
        self._prefilling = []
        self._emit(emits)
        self._batch = batch

    def _prefill_and_join(self, newcomers: list[Sequence]) -> tuple[list[Emit], DecodeBatch | None]:
        emits, batch = self.model.prefill(newcomers)
        if batch is None:
            return emits, self._batch
        return emits, batch if self._batch is None else self._batch.concatenate(batch)

    async def _decode(self) -> None:
        assert self._batch is not None
        batch = self._batch
        self.metrics.batch_size.labels(self.name, "decode").observe(batch.rows)
        try:
            emits, self._batch = await self._call(self._step, batch)
        except Exception as exc:  # every sequence of a failed batch gets the error
            self._batch = None
            self._fail(batch.sequences, exc)
            return
        self._emit(emits)

    def _step(self, batch: DecodeBatch) -> tuple[list[Emit], DecodeBatch | None]:
        emits = batch.step()
        alive = [s for s in batch.sequences if not s.cancelled]
        if len(alive) == len(batch.sequences):
            return emits, batch if alive else None
        self.metrics.cancelled.labels(self.name).inc(len(batch.sequences) - len(alive))
        return emits, batch.filter(alive) if alive else None

    def _emit(self, emits: list[Emit]) -> None:
        for emit in emits:
            emit.sequence.events.put_nowait(emit.event)
            if emit.final:
                emit.sequence.done = True
                self.metrics.e2e_latency.labels(self.name).observe(time.perf_counter() - emit.sequence.enqueued)

    def _fail(self, sequences: list[Sequence], exc: BaseException) -> None:
        if not isinstance(exc, EngineError):
            log.error("%s: batch of %d sequences failed: %s", self.name, len(sequences), exc, exc_info=exc)
            exc = InferenceFailed(f"{self.name}: inference failed (the server log has the details)")
        for seq in sequences:
            if not seq.done:
                seq.done = True
                seq.events.put_nowait(Failure(exc))

    def _set_gauges(self) -> None:
        self.metrics.queue_depth.labels(self.name).set(len(self._waiting))
        self.metrics.running.labels(self.name).set(self._batch.rows if self._batch else 0)
