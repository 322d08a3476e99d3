import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.engine.batcher import DynamicBatcher
from service.engine.errors import InferenceFailed, QueueFull, Unavailable
from service.engine.metrics import Metrics


class Recorder:
    """A fake model: records batch sizes, can block or fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self, items: list[int]) -> list[int]:
        self.gate.wait(5)
        self.batches.append(list(items))
        if self.fail:
            raise RuntimeError("boom")
        return [x * 10 for x in items]


def make(process: Recorder, **kw: int | float) -> DynamicBatcher[int, int]:
    options = {"max_batch_size": 4, "max_wait_s": 0.02, "max_queue_size": 16} | kw
    return DynamicBatcher("fake", process, executor=ThreadPoolExecutor(1), metrics=Metrics(), **options)  # type: ignore[arg-type]


async def test_batches_concurrent_requests_and_keeps_results_apart() -> None:
    model = Recorder()
    batcher = make(model)
    batcher.start()
    results = await asyncio.gather(*(batcher.submit([i]) for i in range(10)))
    assert results == [[i * 10] for i in range(10)]
    assert max(len(b) for b in model.batches) == 4
    assert len(model.batches) < 10
    await batcher.stop(Unavailable("stop"))


async def test_multi_item_request_is_split_across_batches_in_order() -> None:
    model = Recorder()
    batcher = make(model)
    batcher.start()
    assert await batcher.submit(list(range(9))) == [i * 10 for i in range(9)]
    await batcher.stop(Unavailable("stop"))


async def test_a_lone_request_waits_at_most_max_wait() -> None:
    batcher = make(Recorder(), max_wait_s=0.05)
    batcher.start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await batcher.submit([1])
    assert loop.time() - started < 1.0
    await batcher.stop(Unavailable("stop"))


async def test_every_request_in_a_failed_batch_gets_the_error() -> None:
    model = Recorder()
    model.fail = True
    batcher = make(model)
    batcher.start()
    results = await asyncio.gather(*(batcher.submit([i]) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, InferenceFailed) for r in results)
    await batcher.stop(Unavailable("stop"))


async def test_queue_full_rejects_whole_requests() -> None:
    model = Recorder()
    model.gate.clear()  # the first batch blocks, the rest queue up
    batcher = make(model, max_batch_size=1, max_queue_size=2)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit([0]))
    await asyncio.sleep(0.05)
    queued = asyncio.ensure_future(batcher.submit([1, 2]))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        await batcher.submit([3])
    model.gate.set()
    assert await first == [0] and await queued == [10, 20]
    await batcher.stop(Unavailable("stop"))


async def test_cancelled_requests_are_skipped() -> None:
    model = Recorder()
    model.gate.clear()
    batcher = make(model, max_batch_size=1)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit([0]))
    await asyncio.sleep(0.05)
    gone = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0)
    gone.cancel()
    model.gate.set()
    assert await first == [0]
    assert await batcher.submit([2]) == [20]
    assert [1] not in model.batches
    await batcher.stop(Unavailable("stop"))


async def test_stop_fails_the_running_batch_and_the_queue() -> None:
    model = Recorder()
    model.gate.clear()
    batcher = make(model, max_batch_size=1)
    batcher.start()
    running = asyncio.ensure_future(batcher.submit([0]))
    await asyncio.sleep(0.05)
    queued = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0)
    await batcher.stop(Unavailable("shutting down"))
    model.gate.set()
    for request in (running, queued):
        with pytest.raises(Unavailable):
            await request


async def test_one_bad_item_fails_only_its_own_request() -> None:
    class Picky(Recorder):
        def __call__(self, items: list[int]) -> list[int]:
            if any(x < 0 for x in items):  # a row the model cannot run fails the whole call
                raise RuntimeError("index out of range")
            return super().__call__(items)

    batcher = make(Picky(), max_wait_s=0.05)
    batcher.start()
    results = await asyncio.gather(*(batcher.submit([i]) for i in (1, -1, 2, 3)), return_exceptions=True)
    assert results[0] == [10] and results[2] == [20] and results[3] == [30]
    assert isinstance(results[1], InferenceFailed)
    assert "index out of range" not in results[1].message  # ORT's internals stay in the log
    await batcher.stop(Unavailable("stop"))
