"""Continuous batching (as in TGI / vLLM) on one worker thread per model.

New sequences join the running batch at the next step, finished and abandoned ones leave, each keeping
its own KV cache rows. A model plugs in through the small interfaces of `sequence.py`. While a batch
decodes, a model with chunked prefill (the generator) feeds newcomers' prompts SERVE_PREFILL_CHUNK_TOKENS
padded tokens per step, so a burst of prompts, or a long one, delays each running stream's steps by a
bounded amount instead of all at once.

The worker runs prefill and decode steps back to back and never waits for the event loop: it hands
every step's events to the loop with one `call_soon_threadsafe`. The loop only queues sequences
(`submit`), cancels them, and delivers events to their handles. What to admit and when is the
policy's (policy.py); this module holds the thread, the lock and the hand-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from service.engine.errors import EngineError, InferenceFailed, QueueFull, Unavailable
from service.engine.handle import Handle
from service.engine.heap_trim import IdleTrim
from service.engine.metrics import Metrics, ModelMetrics
from service.engine.scheduling.policy import SchedulingPolicy
from service.engine.scheduling.queue import SequenceQueue
from service.engine.sequence import (
    CacheBudgeted,
    ChunkedPrefillModel,
    DecodeBatch,
    DecodeModel,
    Emit,
    PromptChunks,
    SeqT,
    Sequence,
)
from service.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")


Failed = tuple[list[Sequence], EngineError]


class WorkerExecutor(Executor):
    """Runs calls on the scheduler's worker thread between steps (prompt scoring shares the session)."""

    def __init__(self, scheduler: Scheduler[Any]) -> None:
        self.scheduler = scheduler

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.scheduler.call(fn, *args, **kwargs)


class Scheduler(SequenceQueue[SeqT]):
    def __init__(
        self,
        name: str,
        model: DecodeModel[SeqT],
        *,
        max_rows: int,
        max_queue_size: int,
        max_wait_s: float,
        metrics: Metrics,
        prefill_chunk_tokens: int = 0,
    ) -> None:
        self.name = name
        self.model = model
        self.max_rows = max_rows
        # A model whose caches share a memory budget (the in-place generator): admission keeps within it.
        budgeted = model if isinstance(model, CacheBudgeted) and model.cache_budget is not None else None
        self._budgeted = budgeted
        self.policy: SchedulingPolicy[SeqT] = SchedulingPolicy(
            name,
            max_rows=max_rows,
            max_queue_size=max_queue_size,
            max_wait_s=max_wait_s,
            cache_budget=budgeted.cache_budget if budgeted is not None else None,
            cache_cost=budgeted.cache_cost if budgeted is not None else lambda seq: 0,
        )
        self.metrics = metrics
        self.model_metrics = ModelMetrics.of(metrics, name)
        # While a batch decodes, newcomers' prompts go in chunks of chunk_tokens padded tokens, one per step
        # (a model that can, with a budget > 0).
        self._chunked = model if prefill_chunk_tokens > 0 and isinstance(model, ChunkedPrefillModel) else None
        self.chunk_tokens = prefill_chunk_tokens if self._chunked is not None else 0
        self.executor = WorkerExecutor(self)
        self._cond = threading.Condition()  # guards the policy's queue, _jobs, _inflight, _stopping
        self._jobs: list[tuple[Future[Any], Callable[[], Any]]] = []
        self._inflight: list[SeqT] = []  # prefilling or in the batch: what stop() must fail
        self._stopping = False
        self._batch: DecodeBatch[SeqT] | None = None  # the worker's alone
        self._prompts: PromptChunks[SeqT] | None = None  # newcomers half fed (chunked prefill); the worker's alone
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.idle_trim: IdleTrim | None = None  # told when the worker goes idle and busy again (the engine's)

    @classmethod
    def from_settings(
        cls, name: str, model: DecodeModel[SeqT], settings: Settings, metrics: Metrics
    ) -> Scheduler[SeqT]:
        return cls(
            name,
            model,
            max_rows=settings.max_batch_size,
            max_queue_size=settings.max_queue_size,
            max_wait_s=settings.max_wait_ms / 1000,
            metrics=metrics,
            prefill_chunk_tokens=settings.prefill_chunk_tokens,
        )

    @property
    def running(self) -> int:
        """Sequences prefilling or decoding (a translation with 4 beams is one)."""
        return len(self._inflight)

    @property
    def waiting(self) -> int:
        return len(self.policy.waiting)

    # --- the event loop's side ---------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # A daemon: stop() never waits for an ONNX Runtime call in progress, nor does the process exit.
        self._thread = threading.Thread(target=self._work, name=f"serve-{self.name}", daemon=True)
        self._thread.start()

    async def stop(self, error: EngineError) -> None:
        """Fail everything queued or running with `error` (idempotent); the worker exits after its step."""
        with self._cond:
            self._stopping = True
            victims = [*self.policy.waiting, *self._inflight]
            self.policy.waiting.clear()
            jobs, self._jobs = self._jobs, []
            self._cond.notify_all()
        for future, _ in jobs:
            future.cancel()
        self._deliver([], [(list(victims), error)])
        self._set_gauges()

    def _check(self, sequences: list[SeqT], field: str) -> None:
        self.policy.check_request(sequences, field)  # 422: more than the queue could ever hold

    def _enqueue(self, sequences: list[SeqT], handle: Handle[Any, Any], field: str) -> None:
        """All or none, 429 the same way for one and for many."""
        with self._cond:
            if self._stopping:
                raise Unavailable(f"{self.name}: the model is stopped")
            try:
                self.policy.enqueue(sequences)
            except QueueFull:
                self.model_metrics.queue_full.inc()
                raise
            self._cond.notify()
        self._set_gauges()

    def cancel(self, sequences: list[Sequence]) -> None:
        """Client gone or deadline passed: waiting ones leave the queue now, running ones after this step."""
        with self._cond:
            for seq in sequences:
                seq.cancelled = True
            dropped = self.policy.drop(sequences)
            if dropped:
                self.model_metrics.cancelled.inc(dropped)
        self._set_gauges()

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run `fn` on the worker thread before its next step."""
        future: Future[T] = Future()
        with self._cond:
            if self._stopping:
                future.cancel()
                return future
            self._jobs.append((future, lambda: fn(*args, **kwargs)))
            self._cond.notify()
        return future

    def _deliver(self, emits: list[Emit], failures: list[Failed]) -> None:
        """On the loop: events to their handles, in order; nothing for sequences already done."""
        now = time.perf_counter()
        for emit in emits:
            seq = emit.sequence
            if seq.done or seq.handle is None:
                continue
            if emit.final:
                seq.done = True
                self.model_metrics.e2e_latency.observe(now - seq.enqueued)
            seq.handle.put(seq.index, emit.event, emit.final)
        for sequences, error in failures:
            for seq in sequences:
                if not seq.done and seq.handle is not None:
                    seq.done = True
                    seq.handle.fail(error)

    # --- the worker thread ---------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            work = self._next_work()
            if work is None:
                return
            try:
                self._iterate(*work)
            except Exception as exc:  # a bug in this loop, not in a model run: fail what runs, carry on
                self._batch = self._prompts = None
                self._hand_over([], [(list(self._inflight), self._engine_error(exc, self._inflight))])
            with self._cond:
                self._inflight = self._running()
            self._set_gauges()

    def _iterate(self, jobs: list[tuple[Future[Any], Callable[[], Any]]], newcomers: list[SeqT]) -> None:
        for future, job in jobs:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
        if newcomers and self._batch is not None and self._chunked is not None:
            self.model_metrics.prefill_batch.observe(sum(s.rows for s in newcomers))
            self._prompts = self._chunked.start_prefill(newcomers)
        elif newcomers:
            failures: list[Failed] = []
            emits = self._prefill(newcomers, failures)
            self._hand_over(emits, failures)  # first tokens go out before the next step
        if self._prompts is not None:
            self._hand_over(*self._feed_prompts())
        if self._batch is not None:
            self._hand_over(*self._decode())

    def _next_work(self) -> tuple[list[tuple[Future[Any], Callable[[], Any]]], list[SeqT]] | None:
        """Block while idle; then the jobs to run and the newcomers to prefill (None: stop)."""
        with self._cond:
            idle = self._batch is None and self._prompts is None
            if idle and not (self._stopping or self._jobs or self.policy.waiting):
                self._tell_trim(busy=False)
                while not (self._stopping or self._jobs or self.policy.waiting):
                    self._cond.wait()
                self._tell_trim(busy=True)
            self._wait_for_company()
            if self._stopping:
                return None
            jobs, self._jobs = self._jobs, []
            newcomers = self._admit() if self._prompts is None else []  # one group of prompts at a time
            if newcomers:
                self._inflight = [*self._running(), *newcomers]
                self._set_gauges()
            return jobs, newcomers

    def _tell_trim(self, busy: bool) -> None:
        """The worker's idle periods, to the engine's IdleTrim on the loop: once per period, not per request."""
        if self.idle_trim is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
                self._loop.call_soon_threadsafe(self.idle_trim.busy if busy else self.idle_trim.idle, self.name)

    def _wait_for_company(self) -> None:
        """Wait as long as the policy says a burst may gather (never with jobs to run or when stopping)."""
        while not (self._stopping or self._jobs):
            remaining = self.policy.company_wait(idle=self._batch is None and self._prompts is None)
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _admit(self) -> list[SeqT]:
        room = None
        if self._budgeted is not None and self.policy.waiting:
            wanted = self.policy.cache_cost(self.policy.waiting[0])
            room = self._budgeted.cache_room(self._running(), wanted)
        admitted = self.policy.admit(self._batch.rows if self._batch is not None else None, room)
        for seq in admitted:
            self.model_metrics.queue_time.observe((seq.admitted or seq.enqueued) - seq.enqueued)
        return admitted

    def _prefill(self, newcomers: list[SeqT], failures: list[Failed]) -> list[Emit]:
        """Prefill the newcomers and join them to the batch. A failed prefill leaves the running batch
        untouched (concatenate builds a new one); with several newcomers each is retried alone, so only
        the request at fault fails."""
        self.model_metrics.prefill_batch.observe(sum(s.rows for s in newcomers))
        try:
            emits, batch = self.model.prefill(newcomers)
            self._join(batch)
        except Exception as exc:
            if len(newcomers) == 1:
                failures.append((list(newcomers), self._engine_error(exc, newcomers)))
                return []
            return [emit for seq in newcomers for emit in self._prefill([seq], failures)]
        return emits

    def _join(self, batch: DecodeBatch[SeqT] | None) -> None:
        if batch is not None and batch.sequences:
            self._batch = batch if self._batch is None else self._batch.concatenate(batch)

    def _feed_prompts(self) -> tuple[list[Emit], list[Failed]]:
        """The next chunk of the newcomers' prompts (all the rest when nothing else runs: nobody waits);
        after the last, their first tokens, and they join the batch. A failure is retried as a whole
        prefill, which fails only the request at fault."""
        prompts = self._prompts
        assert prompts is not None
        try:
            finished = prompts.advance(self.chunk_tokens if self._batch is not None else None)
            if finished is None:
                return [], []
            self._prompts = None
            emits, batch = finished
            self._join(batch)
            return emits, []
        except Exception:
            self._prompts = None
            failures: list[Failed] = []
            return self._prefill(prompts.sequences, failures), failures

    def _running(self) -> list[SeqT]:
        """Sequences decoding or half prefilled: what stop() and a failed iteration must fail."""
        return [*(self._batch.sequences if self._batch else []), *(self._prompts.sequences if self._prompts else [])]

    def _decode(self) -> tuple[list[Emit], list[Failed]]:
        """One step; the batch is replaced by what is left of it: unfinished and not cancelled."""
        batch = self._batch
        assert batch is not None
        self.model_metrics.decode_batch.observe(batch.rows)
        try:
            emits = batch.step()
        except Exception as exc:  # every sequence of a failed batch gets the error
            self._batch = None
            return [], [(list(batch.sequences), self._engine_error(exc, batch.sequences))]
        alive = [s for s in batch.sequences if not s.cancelled]
        if len(alive) < len(batch.sequences):
            self.model_metrics.cancelled.inc(len(batch.sequences) - len(alive))
        self._batch = (batch if len(alive) == len(batch.sequences) else batch.filter(alive)) if alive else None
        return emits, []

    def _engine_error(self, exc: Exception, sequences: list[SeqT]) -> EngineError:
        if isinstance(exc, EngineError):
            return exc
        log.error("%s: batch of %d sequences failed: %s", self.name, len(sequences), exc, exc_info=exc)
        return InferenceFailed(f"{self.name}: inference failed (the server log has the details)")

    def _hand_over(self, emits: list[Emit], failures: list[Failed]) -> None:
        """The step's one hand-off to the event loop, for every sequence at once."""
        if (emits or failures) and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
                self._loop.call_soon_threadsafe(self._deliver, emits, failures)

    def _set_gauges(self) -> None:
        self.model_metrics.queue_depth.set(len(self.policy.waiting))
        inflight = list(self._inflight)
        self.model_metrics.running.set(len(inflight))
        self.model_metrics.running_rows.set(sum(s.rows for s in inflight))
        if self._budgeted is not None:
            self.model_metrics.kv_cache_usage.set(self._budgeted.cache_usage())
