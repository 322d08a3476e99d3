"""The continuous-batching loop with a fake model: joins, leaves, budgets, waits, hand-offs, failures."""

import asyncio
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from service.engine.errors import InferenceFailed, InvalidInput, QueueFull, RequestTimeout, Unavailable
from service.engine.handle import Handle
from service.engine.metrics import Metrics
from service.engine.scheduling import MAX_PREFILL_TOKENS, STEP_PREFILL_TOKENS, Scheduler
from service.engine.sequence import Emit, Sequence


class Counting(Sequence):
    """Emits 0, 1, ... and finishes after `length` tokens."""

    def __init__(self, length: int, prompt: int = 1, rows: int = 1) -> None:
        super().__init__(rows=rows, prefill_tokens=prompt)
        self.length = length
        self.produced = 0


class FakeBatch:
    def __init__(self, model: "FakeModel", seqs: list[Counting]) -> None:
        self.model, self.seqs = model, seqs

    @property
    def sequences(self) -> list[Counting]:
        return list(self.seqs)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.seqs)

    def step(self) -> list[Emit]:
        self.model.steps.append(len(self.seqs))
        self.model.step_threads.add(threading.current_thread().name)
        if self.model.step_s:
            time.sleep(self.model.step_s)
        if self.model.fail_at == len(self.model.steps):
            raise RuntimeError("boom")
        emits = []
        for s in self.seqs:
            emits.append(Emit(s, s.produced))
            s.produced += 1
            if s.produced == s.length:
                emits.append(Emit(s, "done", final=True))
        self.seqs = [s for s in self.seqs if s.produced < s.length]
        return emits

    def filter(self, keep: list[Counting]) -> "FakeBatch | None":
        kept = [s for s in self.seqs if s in keep]
        return type(self)(self.model, kept) if kept else None

    def concatenate(self, other: Any) -> "FakeBatch":
        return type(self)(self.model, self.seqs + other.seqs)


class FakeModel:
    def __init__(self, step_s: float = 0.0) -> None:
        self.prefills: list[int] = []
        self.steps: list[int] = []
        self.step_threads: set[str] = set()
        self.step_s = step_s
        self.fail_at = 0

    def prefill(self, sequences: list[Counting]) -> tuple[list[Emit], FakeBatch]:
        self.prefills.append(len(sequences))
        return [], FakeBatch(self, list(sequences))


def scheduler(model: FakeModel, **kw: Any) -> Scheduler[Counting]:
    options = {"max_rows": 4, "max_queue_size": 8, "max_wait_s": 0.0} | kw
    return Scheduler("fake", model, metrics=Metrics(), **options)


def submit(s: Scheduler[Counting], seqs: list[Counting], deadline: float | None = None) -> Handle[Any, Any]:
    return s.submit(seqs, deadline, "text")


async def drain(handle: Handle[Any, Any]) -> list[Any]:
    return [event async for event in handle.events()]


def gauge(s: Scheduler[Counting], name: str) -> float | None:
    return s.metrics.registry.get_sample_value(name, {"model": "fake"})


async def test_sequences_join_and_leave_and_get_their_own_events() -> None:
    model = FakeModel()
    s = scheduler(model)
    s.start()
    long = submit(s, [Counting(6)])
    short = submit(s, [Counting(2)])
    assert await drain(short) == [0, 1, "done"]
    assert await drain(long) == [0, 1, 2, 3, 4, 5, "done"]
    assert max(model.steps) == 2 and model.steps[-1] == 1  # ran together, then alone
    assert model.step_threads == {"serve-fake"}  # on the model's worker thread, never on the loop
    await s.stop(Unavailable("stop"))


async def test_one_handle_interleaves_its_sequences_and_returns_results_in_order() -> None:
    s = scheduler(FakeModel())
    s.start()
    handle = submit(s, [Counting(3), Counting(1)])
    events = [item async for item in handle.indexed_events()]
    assert [e for i, e in events if i == 0] == [0, 1, 2, "done"] and [e for i, e in events if i == 1] == [0, "done"]
    assert await submit(s, [Counting(2), Counting(1)]).results() == ["done", "done"]
    await s.stop(Unavailable("stop"))


async def test_rows_limit_admission() -> None:
    model = FakeModel()
    s = scheduler(model, max_rows=4)
    handles = [submit(s, [Counting(3, rows=2)]) for _ in range(3)]  # only two fit at once
    s.start()
    await asyncio.gather(*(drain(h) for h in handles))
    assert model.prefills[0] == 2 and max(model.steps) == 2
    await s.stop(Unavailable("stop"))


async def test_prefill_budget_is_smaller_while_a_batch_runs() -> None:
    """Idle: newcomers share one prefill up to MAX_PREFILL_TOKENS. Running: long prompts join over
    several steps (STEP_PREFILL_TOKENS each), so the running stream keeps getting tokens between them."""
    model = FakeModel(step_s=0.002)
    s = scheduler(model, max_rows=8, max_queue_size=16)
    long = STEP_PREFILL_TOKENS // 2 + 1  # two do not fit in one step's budget
    idle = [Counting(1, prompt=long) for _ in range(3)]
    queued = submit(s, idle)
    s.start()
    await queued.results()
    assert model.prefills[0] == 3 and 3 * long <= MAX_PREFILL_TOKENS  # all three in one prefill
    model.prefills.clear()
    running = submit(s, [Counting(40)])
    events = running.events()
    await anext(events)  # it is decoding
    joiners = submit(s, [Counting(1, prompt=long) for _ in range(3)])
    await joiners.results()
    assert model.prefills == [1, 1, 1, 1]  # the running one, then each long prompt in its own step
    assert [e async for e in events][-1] == "done"
    huge = submit(s, [Counting(1, prompt=MAX_PREFILL_TOKENS // 2 + 1) for _ in range(2)])
    await huge.results()
    assert model.prefills[-2:] == [1, 1]  # one prompt over the budget still runs, alone
    await s.stop(Unavailable("stop"))


async def test_a_lone_request_at_an_idle_model_does_not_wait_for_company() -> None:
    s = scheduler(FakeModel(), max_wait_s=5.0)
    s.start()
    started = time.perf_counter()
    assert await submit(s, [Counting(1)]).result() == "done"
    assert time.perf_counter() - started < 1.0
    await s.stop(Unavailable("stop"))


async def test_a_burst_at_an_idle_model_waits_for_a_full_batch() -> None:
    model = FakeModel()
    s = scheduler(model, max_rows=4, max_wait_s=0.5)
    s.start()
    first = submit(s, [Counting(1), Counting(1)])  # a burst: more than one is waiting
    await asyncio.sleep(0.05)
    second = submit(s, [Counting(1), Counting(1)])  # fills the batch: no more waiting
    started = time.perf_counter()
    await asyncio.gather(first.results(), second.results())
    assert model.prefills == [4] and time.perf_counter() - started < 0.4
    await s.stop(Unavailable("stop"))


async def test_the_worker_does_not_wait_for_the_event_loop_and_hands_over_once_per_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = FakeModel(step_s=0.001)
    s = scheduler(model)
    handovers: list[int] = []
    deliver = s._deliver

    def counting(emits: list[Emit], failures: list[Any]) -> None:
        handovers.append(len(emits))
        deliver(emits, failures)

    monkeypatch.setattr(s, "_deliver", counting)
    s.start()
    handle = submit(s, [Counting(30) for _ in range(3)])
    time.sleep(0.5)  # noqa: ASYNC251 - the event loop is blocked on purpose: the worker still runs every step
    assert len(model.steps) == 30
    results = await handle.results()
    assert results == ["done"] * 3
    decode = [n for n in handovers if n]
    assert len(decode) == 30 and all(n >= 3 for n in decode)  # one hand-off per step, for all three
    await s.stop(Unavailable("stop"))


async def test_limits() -> None:
    s = scheduler(FakeModel(), max_rows=2, max_queue_size=2)
    with pytest.raises(InvalidInput):
        submit(s, [Counting(1, rows=3)])
    with pytest.raises(InvalidInput) as many:
        submit(s, [Counting(1), Counting(1), Counting(1)])  # more than the queue could ever hold
    assert many.value.field == "text"
    submit(s, [Counting(1)])
    with pytest.raises(QueueFull):
        submit(s, [Counting(1), Counting(1)])
    assert s.metrics.registry.get_sample_value("serve_rejected_total", {"model": "fake", "reason": "queue_full"}) == 1


async def test_cancelled_waiting_sequences_leave_the_queue_at_once() -> None:
    s = scheduler(FakeModel(), max_queue_size=2)
    gone = submit(s, [Counting(1), Counting(1)])
    gone.cancel()
    assert s.waiting == 0 and gauge(s, "serve_queue_depth") == 0
    assert gauge(s, "serve_cancelled_total") == 2
    submit(s, [Counting(1), Counting(1)])  # the slots are free again


async def test_running_counts_sequences_and_rows_apart() -> None:
    model = FakeModel(step_s=0.005)
    s = scheduler(model)
    s.start()
    handle = submit(s, [Counting(50, rows=2)])
    events = handle.events()
    assert isinstance(events, AsyncGenerator)  # aclose(): the reader leaves
    await anext(events)
    assert s.running == 1 and gauge(s, "serve_running_sequences") == 1 and gauge(s, "serve_running_rows") == 2
    await events.aclose()  # the reader leaves: the sequence leaves the batch after this step
    for _ in range(200):
        if s.running == 0:
            break
        await asyncio.sleep(0.01)
    assert s.running == 0 and gauge(s, "serve_running_rows") == 0 and len(model.steps) < 50
    await s.stop(Unavailable("stop"))


async def test_deadline_is_a_timeout_and_cancels() -> None:
    model = FakeModel(step_s=0.01)
    s = scheduler(model)
    s.start()
    handle = submit(s, [Counting(1000)], deadline=time.monotonic() + 0.1)
    with pytest.raises(RequestTimeout):
        await drain(handle)
    assert handle.sequences[0].cancelled
    await s.stop(Unavailable("stop"))


async def test_calls_run_on_the_worker_thread() -> None:
    s = scheduler(FakeModel())
    s.start()
    name = await asyncio.get_running_loop().run_in_executor(s.executor, lambda: threading.current_thread().name)
    assert name == "serve-fake"
    await s.stop(Unavailable("stop"))


async def test_a_failed_step_fails_every_sequence_in_the_batch_only() -> None:
    model = FakeModel()
    model.fail_at = 2
    s = scheduler(model)
    s.start()
    a, b = submit(s, [Counting(5)]), submit(s, [Counting(5)])
    for handle in (a, b):
        with pytest.raises(InferenceFailed):
            await drain(handle)
    assert await drain(submit(s, [Counting(2)])) == [0, 1, "done"]
    await s.stop(Unavailable("stop"))


async def test_stop_fails_waiting_and_running() -> None:
    model = FakeModel(step_s=0.01)
    s = scheduler(model, max_rows=1)
    s.start()
    running = submit(s, [Counting(1000)])
    waiting = submit(s, [Counting(3)])
    await anext(running.events())
    await s.stop(Unavailable("shutting down"))
    for handle in (running, waiting):
        with pytest.raises(Unavailable):
            await drain(handle)
    with pytest.raises(Unavailable):
        submit(s, [Counting(1)])


async def test_stop_during_prefill_fails_the_newcomers(monkeypatch: pytest.MonkeyPatch) -> None:
    model = FakeModel()
    started, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()
    original = model.prefill

    def slow_prefill(sequences: list[Counting]) -> tuple[list[Emit], FakeBatch]:
        loop.call_soon_threadsafe(started.set)
        release.wait(5)
        return original(sequences)

    monkeypatch.setattr(model, "prefill", slow_prefill)
    s = scheduler(model)
    s.start()
    handle = submit(s, [Counting(3)])
    await started.wait()
    await s.stop(Unavailable("shutting down"))
    release.set()
    with pytest.raises(Unavailable):
        await drain(handle)


async def test_a_bad_newcomer_fails_only_its_own_request(monkeypatch: pytest.MonkeyPatch) -> None:
    model = FakeModel()
    original, tried = model.prefill, []

    def picky_prefill(sequences: list[Counting]) -> tuple[list[Emit], FakeBatch]:
        tried.append(len(sequences))
        if any(s.length == 99 for s in sequences):  # one row the graph cannot run
            raise RuntimeError("indices element out of data bounds")
        return original(sequences)

    monkeypatch.setattr(model, "prefill", picky_prefill)
    s = scheduler(model, max_wait_s=0.05)
    good, bad, other = submit(s, [Counting(2)]), submit(s, [Counting(99)]), submit(s, [Counting(3)])
    s.start()
    assert await drain(good) == [0, 1, "done"]
    assert await drain(other) == [0, 1, 2, "done"]
    with pytest.raises(InferenceFailed) as failed:
        await drain(bad)
    assert "out of data bounds" not in failed.value.message
    assert tried == [3, 1, 1, 1]  # together first, then each alone
    await s.stop(Unavailable("stop"))


class FakeChunks:
    """Newcomers' prompts fed `max_tokens` padded tokens per call."""

    def __init__(self, model: "ChunkedModel", seqs: list[Counting]) -> None:
        self.model, self.seqs = model, seqs
        self.left = len(seqs) * max(s.prefill_tokens for s in seqs)

    @property
    def sequences(self) -> list[Counting]:
        return list(self.seqs)

    def advance(self, max_tokens: int | None) -> tuple[list[Emit], FakeBatch] | None:
        if self.model.fail_chunks:
            raise RuntimeError("chunk failed")
        fed = self.left if max_tokens is None else min(self.left, max_tokens)
        self.model.log.append(("chunk", fed))
        self.left -= fed
        return None if self.left else ([], LoggedBatch(self.model, list(self.seqs)))


class ChunkedModel(FakeModel):
    def __init__(self, step_s: float = 0.0) -> None:
        super().__init__(step_s)
        self.log: list[tuple[str, int]] = []
        self.fail_chunks = False

    def prefill(self, sequences: list[Counting]) -> tuple[list[Emit], FakeBatch]:
        self.prefills.append(len(sequences))
        return [], LoggedBatch(self, list(sequences))

    def start_prefill(self, sequences: list[Counting]) -> FakeChunks:
        return FakeChunks(self, list(sequences))


class LoggedBatch(FakeBatch):
    def step(self) -> list[Emit]:
        assert isinstance(self.model, ChunkedModel)
        self.model.log.append(("step", len(self.seqs)))
        return super().step()


async def test_prompts_join_a_running_batch_a_chunk_per_step() -> None:
    """An idle model prefills whole prompts; while a batch decodes, a newcomer's prompt goes in chunks of
    at most prefill_chunk_tokens, with a decode step of the running batch after each chunk."""
    model = ChunkedModel(step_s=0.002)
    s = scheduler(model, max_rows=8, prefill_chunk_tokens=32)
    s.start()
    running = submit(s, [Counting(60)])
    events = running.events()
    await anext(events)
    assert model.prefills == [1] and model.log[0] == ("step", 1)  # idle: a whole prefill, then decoding
    joiner = submit(s, [Counting(2, prompt=100)])
    assert await joiner.results() == ["done"]
    chunks = [i for i, (kind, _) in enumerate(model.log) if kind == "chunk"]
    assert [model.log[i][1] for i in chunks] == [32, 32, 32, 4]
    assert all(model.log[i + 1] == ("step", 1) for i in chunks[:-1])  # the running stream stepped between chunks
    assert model.log[chunks[-1] + 1] == ("step", 2)  # then the newcomer decodes with it
    assert [e async for e in events][-1] == "done"
    await s.stop(Unavailable("stop"))


async def test_a_failed_chunk_is_retried_as_a_whole_prefill() -> None:
    model = ChunkedModel(step_s=0.002)
    s = scheduler(model, max_rows=8, prefill_chunk_tokens=8)
    s.start()
    events = submit(s, [Counting(30)]).events()
    await anext(events)
    model.fail_chunks = True
    assert await submit(s, [Counting(2, prompt=40)]).results() == ["done"]
    assert model.prefills == [1, 1]  # the running one's, then the retry of the failed chunked one
    assert [e async for e in events][-1] == "done"
    await s.stop(Unavailable("stop"))


async def test_chunking_off_or_a_model_without_it_prefills_whole_prompts() -> None:
    assert scheduler(ChunkedModel(), prefill_chunk_tokens=0).chunk_tokens == 0
    assert scheduler(FakeModel(), prefill_chunk_tokens=64).chunk_tokens == 0  # no start_prefill
    assert scheduler(ChunkedModel(), prefill_chunk_tokens=64).chunk_tokens == 64
