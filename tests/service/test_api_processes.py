"""SERVE_API_PROCESSES: a front end's engine link (service/multiprocess) against an engine in this process,
over a real socket pair: answers, streams, refusals, cancellation and scoring as in one process.
The forked processes themselves run in test_main_service.py and in the reliability suite."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.engine.engine import Engine
from service.engine.handle import Handle
from service.engine.tasks.classification.service import ClassificationSequence, ClassifyItem
from service.engine.tasks.generation.decoding import TokenEvent
from service.engine.tasks.generation.service import GenerationJob
from service.multiprocess.core import FrontEnd
from service.multiprocess.front import GONE, attach_front
from service.multiprocess.wire import Link, Message, frame
from service.request_context import RequestTiming
from service.settings import Settings
from tests.service.conftest import Served

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@dataclass
class Split:
    """An app whose models run in `core`, reached over a socket pair, as a front-end process's."""

    served: Served
    core: Engine
    front_end: FrontEnd


@asynccontextmanager
async def split(settings: Settings) -> AsyncIterator[Split]:
    core = Engine(settings)
    core.load()
    await core.start()
    here, there = socket.socketpair()
    front_end = FrontEnd(core, pid=0)
    await front_end.connect(here)
    core.ready = True
    front_end.state()
    front = Engine(settings)
    front.load()
    attach_front(front, there, on_gone=lambda: None)
    app = create_app(settings, front)
    try:
        async with app.router.lifespan_context(app):
            while not (front.ready or front.failure):
                await asyncio.sleep(0.01)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield Split(Served(app, client), core, front_end)
    finally:
        await core.stop()
        if front_end.link is not None:
            front_end.link.close()


@pytest.fixture
def splitting(make_settings: Callable[..., Settings]) -> Callable[..., AbstractAsyncContextManager[Split]]:
    def start(**overrides: Any) -> AbstractAsyncContextManager[Split]:
        return split(make_settings(**overrides))

    return start


REQUESTS = [
    ("/v1/classify", {"text": ["a fine film", "dull", "x " * 40]}),
    ("/v1/translate", {"text": ["the house", "a long sentence for the small model"], "num_beams": 2}),
    ("/v1/generate", {"prompt": "Hello", "max_new_tokens": 6, "temperature": 0.8, "seed": 3}),
    (
        "/v1/completions",
        {"model": "generator", "prompt": "Hi there", "max_tokens": 2, "echo": True, "logprobs": 2, "temperature": 0},
    ),
]


async def test_answers_are_those_of_one_process(
    serving: Callable[..., AbstractAsyncContextManager[Served]],
    splitting: Callable[..., AbstractAsyncContextManager[Split]],
) -> None:
    async with serving() as one:
        expected = [(await one.client.post(path, json=body)).json() for path, body in REQUESTS]
    async with splitting() as s:
        got = [(await s.served.client.post(path, json=body)).json() for path, body in REQUESTS]
        timed = await s.served.client.post("/v1/classify", json={"text": "timed"})
    for answer in (*expected, *got):
        answer.pop("id", None), answer.pop("created", None)
    assert got == expected
    assert "x-queue-time" in timed.headers  # the engine process sends when each sequence left its queue


async def test_streams_are_those_of_one_process(
    serving: Callable[..., AbstractAsyncContextManager[Served]],
    splitting: Callable[..., AbstractAsyncContextManager[Split]],
) -> None:
    body = {"prompt": "Once", "max_new_tokens": 8, "ignore_eos": True, "seed": 1, "temperature": 0.7, "stream": True}

    async def stream(client: httpx.AsyncClient) -> list[str]:
        async with client.stream("POST", "/v1/generate", json=body) as response:
            assert response.status_code == 200
            return [line async for line in response.aiter_lines() if line.startswith("data:")]

    async with serving() as one:
        expected = await stream(one.client)
    async with splitting() as s:
        assert await stream(s.served.client) == expected
        assert len(expected) == 9  # 8 tokens and the result


async def test_refusals_keep_their_status(splitting: Callable[..., AbstractAsyncContextManager[Split]]) -> None:
    """The engine process refuses (429 queue full, 422 more than the queue holds); the front end answers so."""
    async with splitting(max_queue_size=2, max_batch_size=1) as s:
        client = s.served.client
        too_many = await client.post("/v1/classify", json={"text": ["a", "b", "c"]})
        assert too_many.status_code == 422 and too_many.json()["error"]["field"] == "text"
        slow = {"prompt": "Hi", "max_new_tokens": 32, "ignore_eos": True}
        busy = [asyncio.ensure_future(client.post("/v1/generate", json=slow)) for _ in range(8)]
        statuses = sorted(r.status_code for r in await asyncio.gather(*busy))
        assert 429 in statuses and 200 in statuses, statuses
        refused = next(r for r in await asyncio.gather(*busy) if r.status_code == 429)
        assert refused.json()["error"]["type"] == "queue_full" and "retry-after" in refused.headers


async def test_a_request_that_leaves_frees_the_engine(
    splitting: Callable[..., AbstractAsyncContextManager[Split]], slow_down: Callable[..., Any]
) -> None:
    """What a route does when its client goes away or its deadline passes: the sequence leaves the engine."""
    async with splitting(max_new_tokens=200) as s:
        assert s.core.generator is not None
        slow_down(s.core.generator.model.session, 0.005)
        front: Engine = s.served.app.state.engine
        job = GenerationJob(["Hi"], ["prompt"], max_new_tokens=200, ignore_eos=True)
        handle = await front.submit(job)
        events = handle.events()
        await anext(events), await anext(events)
        await events.aclose()  # cancels, as a route's reader leaving does
        cancelled = {"model": "generator"}
        for _ in range(500):
            if s.core.metrics.registry.get_sample_value("serve_cancelled_total", cancelled) == 1:
                break
            await asyncio.sleep(0.01)
        assert s.core.metrics.registry.get_sample_value("serve_cancelled_total", cancelled) == 1
        assert not s.front_end.requests


async def test_engine_gone_fails_requests_and_health(
    splitting: Callable[..., AbstractAsyncContextManager[Split]],
) -> None:
    async with splitting(max_new_tokens=200) as s:
        body = {"prompt": "Hi", "max_new_tokens": 200, "ignore_eos": True}
        running = asyncio.ensure_future(s.served.client.post("/v1/generate", json=body))
        while not s.front_end.requests:
            await asyncio.sleep(0.005)
        assert s.front_end.link is not None
        s.front_end.link.close()
        answer = await running
        assert answer.status_code == 503 and GONE in answer.json()["error"]["message"]
        later = await s.served.client.post("/v1/classify", json={"text": "hi"})
        assert later.status_code == 503


def test_a_sequence_crosses_without_its_handle_and_timing() -> None:
    seq = ClassificationSequence(ClassifyItem([1, 2, 3], [0, 0, 0], False), top_k=None)
    seq.timing = RequestTiming(started=1.0)
    seq.handle = Handle("m", [seq], None, lambda _: None)
    copy = pickle.loads(pickle.dumps(seq))
    assert copy.handle is None and copy.timing is None
    assert copy.item == seq.item and copy.enqueued == seq.enqueued and copy.handle is None
    assert seq.handle is not None and seq.timing is not None  # the original keeps them


async def test_frames_survive_any_split_of_the_byte_stream() -> None:
    got: list[Message] = []
    link = Link(got.append, lambda: None)
    messages = [("event", i, 0, TokenEvent(i, i, "é" * i, False), i == 2, None) for i in range(3)]
    data = frame(messages[:2]) + frame(messages[2:])
    for i in range(len(data)):  # one byte at a time
        link.data_received(data[i : i + 1])
    assert got == messages


def test_a_killed_servers_metrics_folder_goes_when_the_next_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from service.engine import metrics

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = tmp_path / f"serve-metrics-{finished.stdout.strip()}-abc", tmp_path / f"serve-metrics-{os.getpid()}-x"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "counter_1.db").write_bytes(b"\0")
    metrics._remove_orphaned_folders()
    assert not dead.exists() and alive.exists()
