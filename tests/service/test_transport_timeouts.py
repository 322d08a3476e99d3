"""The body deadline (SERVE_BODY_TIMEOUT_S) as the app applies it, and uvicorn's configuration from the
settings. tests/reliability/transport.py runs the same over real sockets, with the protocol's part."""

import asyncio
import json
from typing import Any

from fastapi import FastAPI

from service.__main__ import server_config
from service.http_protocol import TimeoutProtocol
from tests.service.sse_events import events

SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/generate",
    "raw_path": b"/v1/generate",
    "query_string": b"",
    "root_path": "",
    "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
    "client": ("127.0.0.1", 50000),
    "server": ("test", 80),
    "state": {},
}


async def _call(app: FastAPI, chunks: list[tuple[float, bytes]], stall: bool) -> list[dict[str, Any]]:
    """Send the body as (delay, bytes) chunks; `stall`: the last one never comes (the client stops mid-body)."""
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if pending:
            delay, chunk = pending.pop(0)
            await asyncio.sleep(delay)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending) or stall}
        await asyncio.Event().wait()  # no more body, and no disconnect: a client that just stops
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(dict(SCOPE), receive, send), 10)
    return sent


def _body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_a_stalled_body_gets_408_closes_and_frees_its_slot(serving) -> None:
    async with serving(body_timeout_s=0.3) as s:
        started = asyncio.get_running_loop().time()
        sent = await _call(s.app, [(0, b'{"prompt": '), (0.1, b'"Once')], stall=True)
        took = asyncio.get_running_loop().time() - started
        assert sent[0]["status"] == 408
        assert (b"connection", b"close") in [(k.lower(), v) for k, v in sent[0]["headers"]]
        error = json.loads(_body(sent))["error"]
        assert error["type"] == "request_timeout" and error["field"] == "body"
        assert "SERVE_BODY_TIMEOUT_S" in error["message"]
        assert 0.3 <= took < 2
        assert s.app.state.inflight.count == 0
        metrics = (await s.client.get("/metrics")).text
        assert 'serve_requests_total{endpoint="/v1/generate",status="408"} 1.0' in metrics


async def test_a_body_in_pieces_within_the_deadline_is_served(serving) -> None:
    async with serving(body_timeout_s=1.0) as s:
        body = json.dumps({"prompt": "Once", "max_new_tokens": 2}).encode()
        pieces = [(0.05, body[i : i + 4]) for i in range(0, len(body), 4)]
        sent = await _call(s.app, pieces, stall=False)
        assert sent[0]["status"] == 200, _body(sent)


async def test_the_deadline_ends_with_the_body(serving, slow_down, call_and_hang_up) -> None:
    """A stream that outlasts the body deadline runs on: after the body, receive() only waits for the
    client to leave (Starlette's disconnect listener), which no deadline may cut."""
    async with serving(body_timeout_s=0.2) as s:
        slow_down(s.engine.generator.model.session, 0.05)
        body = {"prompt": "hi", "max_new_tokens": 12, "ignore_eos": True, "stream": True}
        started = asyncio.get_running_loop().time()
        sent = await call_and_hang_up(s.app, "/v1/generate", json.dumps(body).encode(), asyncio.Event())
        assert asyncio.get_running_loop().time() - started > 0.4  # it did outlast the deadline
        assert sent[0]["status"] == 200
        assert events(_body(sent))[-1][0] == "done"


def test_uvicorn_runs_with_the_transport_settings(make_settings) -> None:
    settings = make_settings(header_timeout_s=3, body_timeout_s=7)
    config = server_config(FastAPI(), settings)
    protocol = config.http
    assert isinstance(protocol, type) and issubclass(protocol, TimeoutProtocol)
    assert (protocol.header_timeout_s, protocol.body_timeout_s) == (3, 7)
    assert config.timeout_keep_alive == settings.keepalive_timeout_s
    # Idle connections outlive every common client's pool (httpx 5 s, aiohttp 15 s, nginx upstream 60 s):
    # a server that closes first races the client's next request on that connection.
    assert settings.keepalive_timeout_s > 60
