"""The idle trim: once every model's worker has been idle for the delay after work, the heap goes back to the OS
once (service/engine/heap_trim.py); never per request, never without work, never while a worker is busy."""

import asyncio
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from service.engine.heap_trim import TRIM_AVAILABLE, IdleTrim, hold_freed_memory
from tests.service.conftest import Served
from tests.service.test_engine_scheduler import Counting, FakeModel, drain, scheduler, submit

DELAY_S = 0.05


class Releases:
    """A stand-in for malloc_trim: counts its calls and the threads they ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self) -> None:
        self.threads.append(threading.current_thread().name)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_a_burst_is_trimmed_once_when_the_worker_runs_out_of_work() -> None:
    releases = Releases()
    trim = IdleTrim(DELAY_S, releases)
    model = FakeModel(step_s=0.001)
    s = scheduler(model)  # 4 rows at a time: the 8 sequences take turns, the worker never idle in between
    s.idle_trim = trim
    s.start()
    await asyncio.sleep(4 * DELAY_S)
    assert trim.trims == 0  # idle from the start, no work yet: nothing to give back
    handles = [submit(s, [Counting(length=5)]) for _ in range(8)]
    for handle in handles:
        await drain(handle)
    await until(lambda: len(releases.threads) == 1)
    await asyncio.sleep(4 * DELAY_S)
    assert len(model.steps) >= 10 and len(releases.threads) == 1 and trim.trims == 1
    assert releases.threads[0] != threading.current_thread().name  # off the event loop
    await drain(submit(s, [Counting(length=2)]))  # the next burst: its own trim
    await until(lambda: len(releases.threads) == 2)


@pytest.mark.parametrize(
    ("calls", "last_idle"),
    [
        # Work within the delay puts the trim off: busy again before the delay ran out, no trim.
        ([("busy", "a"), ("idle", "a"), ("busy", "a")], "a"),
        # The trim waits for every worker: the generator still runs.
        ([("busy", "translator"), ("busy", "generator"), ("idle", "translator")], "generator"),
    ],
    ids=["work_within_the_delay_puts_the_trim_off", "the_trim_waits_for_every_worker"],
)
async def test_no_trim_while_a_worker_is_busy(calls: list[tuple[str, str]], last_idle: str) -> None:
    releases = Releases()
    trim = IdleTrim(DELAY_S, releases)
    for call, worker in calls:
        getattr(trim, call)(worker)
    await asyncio.sleep(4 * DELAY_S)
    assert releases.threads == []
    trim.idle(last_idle)
    await until(lambda: len(releases.threads) == 1)


async def test_the_server_trims_after_a_burst_and_its_sessions_run_without_the_arena(
    serving: Callable[..., AbstractAsyncContextManager[Served]],
) -> None:
    async with serving(memory_trim_idle_s=DELAY_S) as served:
        trim = served.engine.idle_trim
        assert (trim is not None) == TRIM_AVAILABLE
        if trim is None:  # not glibc: no trim, and ONNX Runtime's arena as before
            return
        releases = Releases()
        trim.release = releases
        sessions = served.engine.models["classifier"].sessions.values()
        assert not any(s.session.get_session_options().enable_cpu_mem_arena for s in sessions)
        answers = await asyncio.gather(*(served.client.post("/v1/classify", json={"text": "fine"}) for _ in range(16)))
        assert all(a.status_code == 200 for a in answers)
        await until(lambda: len(releases.threads) >= 1)
        assert len(releases.threads) < len(answers)  # per idle period, not per request


async def test_without_the_trim_the_arena_stays(serving: Callable[..., AbstractAsyncContextManager[Served]]) -> None:
    async with serving(memory_trim_idle_s=0) as served:
        assert served.engine.idle_trim is None
        sessions: Any = served.engine.models["classifier"].sessions.values()
        assert all(s.session.get_session_options().enable_cpu_mem_arena for s in sessions)


def test_glibc_takes_the_fixed_thresholds() -> None:
    assert hold_freed_memory() == TRIM_AVAILABLE
