"""Dynamic batching (as in Triton / Ray Serve): a bounded queue of items, one future per item, run in
batches of up to `max_batch_size`, waiting at most `max_wait_ms` for a batch to fill."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from service.engine.errors import EngineError, InferenceFailed, QueueFull
from service.engine.metrics import Metrics
from service.request_context import RequestTiming, current_timing

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


@dataclass
class _Entry(Generic[I, O]):
    item: I
    future: asyncio.Future[O]
    enqueued: float = field(default_factory=time.perf_counter)
    timing: RequestTiming | None = field(default_factory=current_timing)  # the HTTP request's, if any


class DynamicBatcher(Generic[I, O]):
    def __init__(
        self,
        name: str,
        process: Callable[[list[I]], list[O]],
        *,
        max_batch_size: int,
        max_wait_s: float,
        max_queue_size: int,
        executor: Executor,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.process = process  # blocking: runs on `executor`, never on the event loop
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_queue_size = max_queue_size
        self.executor = executor
        self.metrics = metrics
        self._queue: deque[_Entry[I, O]] = deque()
        self._running: list[_Entry[I, O]] = []  # the batch on the executor (stop() fails it too)
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self, error: EngineError) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for entry in [*self._running, *self._queue]:
            if not entry.future.done():
                entry.future.set_exception(error)
        self._queue.clear()
        self._set_depth()

    def _set_depth(self) -> None:
        self.metrics.queue_depth.labels(self.name).set(len(self._queue))

    async def submit(self, items: list[I]) -> list[O]:
        """Queue all items or none (429 the same way for one item and for many); wait for their outputs."""
        if len(self._queue) + len(items) > self.max_queue_size:
            self.metrics.rejected.labels(self.name, "queue_full").inc()
            raise QueueFull(f"{self.name}: queue is full ({len(self._queue)} waiting, limit {self.max_queue_size})")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[O]] = [loop.create_future() for _ in items]
        self._queue.extend(_Entry(item, future) for item, future in zip(items, futures, strict=True))
        self._set_depth()
        self._arrived.set()
        # Cancelling this coroutine (client gone, timeout) cancels the futures; the loop skips those items.
        return list(await asyncio.gather(*futures))

    async def _loop(self) -> None:
        while True:
            await self._wait_for_batch()
            batch = self._take()
            if batch:
                await self._run(batch)

    async def _wait_for_batch(self) -> None:
        """Return once the queue holds a full batch or its oldest item has waited max_wait_s."""
        while True:
            self._arrived.clear()
            if self._queue:
                remaining = self._queue[0].enqueued + self.max_wait_s - time.perf_counter()
                if len(self._queue) >= self.max_batch_size or remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except TimeoutError:
                    return
            else:
                await self._arrived.wait()

    def _take(self) -> list[_Entry[I, O]]:
        batch: list[_Entry[I, O]] = []
        now = time.perf_counter()
        while self._queue and len(batch) < self.max_batch_size:
            entry = self._queue.popleft()
            if entry.future.done():  # cancelled while waiting
                continue
            self.metrics.queue_time.labels(self.name).observe(now - entry.enqueued)
            batch.append(entry)
            if entry.timing is not None:
                entry.timing.admit(entry.enqueued, now)
        self._set_depth()
        return batch

    async def _run(self, batch: list[_Entry[I, O]]) -> None:
        self.metrics.batch_size.labels(self.name, "batch").observe(len(batch))
        loop = asyncio.get_running_loop()
        self._running = batch  # kept if stop() cancels us mid-call, so it can fail these too
        try:
            outputs = await loop.run_in_executor(self.executor, self.process, [e.item for e in batch])
            if len(outputs) != len(batch):
                raise InferenceFailed(f"{self.name}: batch of {len(batch)} produced {len(outputs)} outputs")
        except Exception as exc:
            self._running = []
            if len(batch) > 1 and not isinstance(exc, EngineError):  # find the item at fault: run each alone
                for entry in batch:
                    await self._run([entry])
                return
            log.exception("%s: batch of %d failed", self.name, len(batch))
            failed = InferenceFailed(f"{self.name}: inference failed (the server log has the details)")
            error = exc if isinstance(exc, EngineError) else failed
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        self._running = []
        for entry, output in zip(batch, outputs, strict=True):
            if not entry.future.done():
                entry.future.set_result(output)
                self.metrics.e2e_latency.labels(self.name).observe(time.perf_counter() - entry.enqueued)
