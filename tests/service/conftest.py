"""Fixtures for the service tests: settings on the tiny artifacts (tests/conftest.py), apps, clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message

from service.app import create_app
from service.engine.engine import Engine
from service.settings import Settings


@pytest.fixture
def make_settings(tiny_artifacts: Path) -> Callable[..., Settings]:
    """Settings for tests: tiny artifacts, one ORT thread, short limits, no warm-up unless asked."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "artifacts_dir": tiny_artifacts,
            "intra_op_threads": 1,
            "inter_op_threads": 1,
            "max_new_tokens": 32,
            "max_wait_ms": 2.0,
            "warmup": False,
        }
        values.update(overrides)
        return Settings(**values)

    return make


@dataclass
class Served:
    app: FastAPI
    client: httpx.AsyncClient

    @property
    def engine(self) -> Engine:
        engine: Engine = self.app.state.engine
        return engine


@asynccontextmanager
async def serve(settings: Settings, wait_ready: bool = True) -> AsyncIterator[Served]:
    """Run the app's lifespan and give an httpx client on the ASGI app (no sockets)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        if wait_ready:
            for _ in range(600):
                if app.state.engine.ready or app.state.engine.failure:
                    break
                await asyncio.sleep(0.05)
            assert app.state.engine.ready, app.state.engine.failure
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            yield Served(app, client)


@pytest.fixture
def serving(make_settings: Callable[..., Settings]) -> Callable[..., AbstractAsyncContextManager[Served]]:
    """`async with serving(max_batch_size=1) as s:` runs an app with those setting overrides."""

    def start(wait_ready: bool = True, **overrides: Any) -> AbstractAsyncContextManager[Served]:
        return serve(make_settings(**overrides), wait_ready)

    return start


@pytest.fixture
async def served(serving: Callable[..., AbstractAsyncContextManager[Served]]) -> AsyncIterator[Served]:
    async with serving() as s:
        yield s


@pytest.fixture
def slow_down(monkeypatch: pytest.MonkeyPatch) -> Callable[..., threading.Event]:
    """`slow_down(session, seconds)` makes every ORT call of that session take longer; the returned
    event, once cleared, holds calls until it is set again (a stuck model)."""

    def patch(session: Any, seconds: float = 0.0) -> threading.Event:
        gate = threading.Event()
        gate.set()
        def slowed(original: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                gate.wait(30)
                time.sleep(seconds)
                return original(*args, **kwargs)

            return run

        for method in ("run", "run_in_place"):  # a graph with an in-place cache runs through the second
            if hasattr(session, method):
                monkeypatch.setattr(session, method, slowed(getattr(session, method)))
        return gate

    return patch


def http_scope(path: str) -> dict[str, Any]:
    """The ASGI scope of a JSON POST to `path`, as uvicorn would build it."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
        "state": {},
    }


async def asgi_call(app: FastAPI, path: str, body: bytes, hang_up: asyncio.Event) -> list[Message]:
    """Call the app as a server would, with a client that hangs up when `hang_up` is set."""
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await hang_up.wait()
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(http_scope(path), receive, send)
    return sent


@pytest.fixture
def call_and_hang_up() -> Callable[..., Any]:
    return asgi_call
