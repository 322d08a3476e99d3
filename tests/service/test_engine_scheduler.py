"""The continuous-batching loop with a fake model: joins, leaves, budgets, failures."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from service.engine.errors import InferenceFailed, InvalidInput, QueueFull, Unavailable
from service.engine.metrics import Metrics
from service.engine.scheduler import MAX_PREFILL_TOKENS, Emit, Scheduler, Sequence


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
    def sequences(self) -> list[Sequence]:
        return list(self.seqs)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.seqs)

    def step(self) -> list[Emit]:
        self.model.steps.append(len(self.seqs))
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

    def filter(self, keep: list[Sequence]) -> "FakeBatch | None":
        kept = [s for s in self.seqs if s in keep]
        return FakeBatch(self.model, kept) if kept else None

    def concatenate(self, other: Any) -> "FakeBatch":
        return FakeBatch(self.model, self.seqs + other.seqs)


class FakeModel:
    def __init__(self) -> None:
        self.prefills: list[int] = []
        self.steps: list[int] = []
        self.fail_at = 0

    def prefill(self, sequences: list[Sequence]) -> tuple[list[Emit], FakeBatch]:
        self.prefills.append(len(sequences))
        return [], FakeBatch(self, [s for s in sequences if isinstance(s, Counting)])


def scheduler(model: FakeModel, **kw: Any) -> Scheduler:
    options = {"max_rows": 4, "max_queue_size": 8, "max_wait_s": 0.0} | kw
    return Scheduler("fake", model, executor=ThreadPoolExecutor(1), metrics=Metrics(), **options)


async def drain(seq: Sequence) -> list[Any]:
    return [event async for event in seq.stream()]


async def test_sequences_join_and_leave_and_get_their_own_events() -> None:
    model = FakeModel()
    s = scheduler(model)
    s.start()
    short, long = Counting(2), Counting(6)
    s.submit([long])
    s.submit([short])
    assert await drain(short) == [0, 1, "done"]
    assert await drain(long) == [0, 1, 2, 3, 4, 5, "done"]
    assert max(model.steps) == 2 and model.steps[-1] == 1  # ran together, then alone
    await s.stop(Unavailable("stop"))


async def test_rows_and_prefill_budget_limit_admission() -> None:
    model = FakeModel()
    s = scheduler(model, max_rows=4)
    seqs = [Counting(3, rows=2) for _ in range(3)]  # only two fit at once
    big = [Counting(1, prompt=MAX_PREFILL_TOKENS // 2 + 1) for _ in range(2)]  # one per prefill
    s.submit(seqs)
    s.start()
    await asyncio.gather(*(drain(x) for x in seqs))
    assert model.prefills[0] == 2 and max(model.steps) == 2
    s.submit(big)
    await asyncio.gather(*(drain(x) for x in big))
    assert model.prefills[-2:] == [1, 1]
    await s.stop(Unavailable("stop"))


async def test_limits() -> None:
    s = scheduler(FakeModel(), max_rows=2, max_queue_size=2)
    with pytest.raises(InvalidInput):
        s.submit([Counting(1, rows=3)])
    with pytest.raises(QueueFull):
        s.submit([Counting(1), Counting(1), Counting(1)])


async def test_a_failed_step_fails_every_sequence_in_the_batch_only() -> None:
    model = FakeModel()
    model.fail_at = 2
    s = scheduler(model)
    s.start()
    a, b = Counting(5), Counting(5)
    s.submit([a, b])
    for seq in (a, b):
        with pytest.raises(InferenceFailed):
            await drain(seq)
    later = Counting(2)
    s.submit([later])
    assert await drain(later) == [0, 1, "done"]
    await s.stop(Unavailable("stop"))


async def test_stop_fails_waiting_and_running() -> None:
    s = scheduler(FakeModel())
    waiting = Counting(3)
    s.submit([waiting])
    await s.stop(Unavailable("shutting down"))
    with pytest.raises(Unavailable):
        await drain(waiting)


async def test_stop_during_prefill_fails_the_newcomers() -> None:
    model = FakeModel()
    started, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()
    original = model.prefill

    def slow_prefill(sequences: list[Sequence]) -> tuple[list[Emit], FakeBatch]:
        loop.call_soon_threadsafe(started.set)
        release.wait(5)
        return original(sequences)

    model.prefill = slow_prefill  # type: ignore[method-assign]
    s = scheduler(model)
    s.start()
    seq = Counting(3)
    s.submit([seq])
    await started.wait()
    await s.stop(Unavailable("shutting down"))
    release.set()
    with pytest.raises(Unavailable):
        await drain(seq)


async def test_a_bad_newcomer_fails_only_its_own_request() -> None:
    model = FakeModel()
    original = model.prefill

    def picky_prefill(sequences: list[Sequence]) -> tuple[list[Emit], FakeBatch]:
        if any(getattr(s, "length", 0) == 99 for s in sequences):  # one row the graph cannot run
            raise RuntimeError("indices element out of data bounds")
        return original(sequences)

    model.prefill = picky_prefill  # type: ignore[method-assign]
    s = scheduler(model, max_wait_s=0.05)
    s.start()
    good, bad, other = Counting(2), Counting(99), Counting(3)
    s.submit([good, bad, other])
    assert await drain(good) == [0, 1, "done"]
    assert await drain(other) == [0, 1, 2, "done"]
    with pytest.raises(InferenceFailed) as failed:
        await drain(bad)
    assert "out of data bounds" not in failed.value.message
    await s.stop(Unavailable("stop"))
