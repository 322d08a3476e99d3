"""The body deadline (SERVE_BODY_TIMEOUT_S) as the app applies it, the send timeout (SERVE_SEND_TIMEOUT_S)
under uvicorn over a real socket, and uvicorn's configuration from the settings.
harness/reliability/transport.py runs the same against the whole server, with the protocol's part."""

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from service.api.asgi.tracing import RequestContextMiddleware
from service.http_protocol import TimeoutProtocol, timeout_protocol
from service.logs import RequestIdFilter
from service.server import server_config
from tests.service.conftest import http_scope
from tests.service.sse_events import events


async def _call(app: FastAPI, chunks: list[tuple[float, bytes]], stall: bool) -> list[Message]:
    """Send the body as (delay, bytes) chunks; `stall`: the last one never comes (the client stops mid-body)."""
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if pending:
            delay, chunk = pending.pop(0)
            await asyncio.sleep(delay)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending) or stall}
        await asyncio.Event().wait()  # no more body, and no disconnect: a client that just stops
        raise AssertionError("unreachable")

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await asyncio.wait_for(app(http_scope("/v1/generate"), receive, send), 10)
    return sent


def _body(sent: list[Message]) -> bytes:
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
    settings = make_settings(header_timeout_s=3, body_timeout_s=7, send_timeout_s=11)
    config = server_config(FastAPI(), settings)
    protocol = config.http
    assert isinstance(protocol, type) and issubclass(protocol, TimeoutProtocol)
    assert (protocol.header_timeout_s, protocol.body_timeout_s, protocol.send_timeout_s) == (3, 7, 11)
    assert make_settings().send_timeout_s == 60  # nginx's send_timeout
    assert config.timeout_keep_alive == settings.keepalive_timeout_s
    # Idle connections outlive every common client's pool (httpx 5 s, aiohttp 15 s, nginx upstream 60 s):
    # a server that closes first races the client's next request on that connection.
    assert settings.keepalive_timeout_s > 60


# --- the send timeout, under uvicorn over a real socket --------------------------------------------------

CHUNK = b"x" * 65536


class _Streamer:
    """An endless stream (`chunks` chunks, if given) as Starlette streams the app's events: a client that
    goes away ends it through the disconnect listener. `ended` is set when the source is closed."""

    def __init__(self, chunks: int | None = None) -> None:
        self.chunks = chunks
        self.ended = asyncio.Event()

    async def _source(self) -> AsyncIterator[bytes]:
        try:
            sent = 0
            while self.chunks is None or sent < self.chunks:
                yield CHUNK
                sent += 1
                await asyncio.sleep(0)  # as the engine's events are awaited: the disconnect listener gets to run
        finally:
            self.ended.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await StreamingResponse(self._source())(scope, receive, send)


@contextlib.asynccontextmanager
async def _uvicorn(app: Any, send_timeout_s: float) -> AsyncIterator[int]:
    listener = socket.socket()
    # Connections inherit a small fixed send buffer (no autotuning up to 4 MB): sends wait after ~100 kB
    # unread (this, the client's receive buffer and the transport's 64 kB high-water mark).
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app if isinstance(app, FastAPI) else RequestContextMiddleware(app),  # the request id, as in the app
        http=timeout_protocol(10, 30, send_timeout_s),
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        listener.close()


def _get(request_id: str) -> bytes:
    return f"GET /stream HTTP/1.1\r\nHost: x\r\nX-Request-Id: {request_id}\r\n\r\n".encode()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="service.http_protocol")
    caplog.handler.addFilter(RequestIdFilter())  # as the server's handler: records carry the request id
    return caplog


def _cuts(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "SERVE_SEND_TIMEOUT_S" in r.getMessage()]


async def test_a_client_that_never_reads_is_cut_at_the_send_timeout(warnings: pytest.LogCaptureFixture) -> None:
    """Before the send timeout the stream's send waited for good: connection and in-flight slot held."""
    app = _Streamer()
    loop = asyncio.get_running_loop()
    async with _uvicorn(app, send_timeout_s=0.5) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, _get("never-reads"))
            started = time.monotonic()
            await asyncio.wait_for(app.ended.wait(), 0.5 + 1.0)  # the source closed: the request ended
            ended_s = time.monotonic() - started
            with contextlib.suppress(ConnectionResetError):  # aborted: reset, or the end of what it sent
                while await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 2):
                    pass
        finally:
            sock.close()
    assert 0.5 <= ended_s < 1.5
    cut = _cuts(warnings)
    assert len(cut) == 1, warnings.text
    assert getattr(cut[0], "request_id", None) == "never-reads"
    assert cut[0].getMessage().startswith("GET /stream: a send waited 0.5 s")


async def test_a_client_that_reads_slowly_gets_the_whole_answer(warnings: pytest.LogCaptureFixture) -> None:
    """Sends wait on the full buffer again and again, each less than the timeout: nothing is cut."""
    chunks = 32  # 2 MB, read 256 kB every 0.2 s: sends wait on the full buffer, 0.2 s at most
    app = _Streamer(chunks)
    async with _uvicorn(app, send_timeout_s=1.0) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(_get("reads-slowly"))
        await reader.readuntil(b"\r\n\r\n")
        received = 0
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                size_line = await reader.readuntil(b"\r\n")  # chunked transfer encoding
                size = int(size_line.strip(), 16)
                if size == 0:
                    break
                received += len(await reader.readexactly(size + 2)) - 2
                if received % (1 << 18) == 0:
                    await asyncio.sleep(0.2)
        writer.close()
    assert received == chunks * len(CHUNK)
    assert not _cuts(warnings)


async def test_an_unread_stream_ends_its_request_and_its_generation(serving, slow_down, warnings) -> None:
    """The app under uvicorn: a stream queued on a connection behind an answer nobody reads waits in its
    first send. At the send timeout it ends as a request whose client left: the in-flight slot is freed and
    the generation stops, long before its tokens would have run out."""
    async with serving(send_timeout_s=0.5) as s:
        slow_down(s.engine.generator.model.session, 0.1)  # 32 tokens: over 3 s
        async with _uvicorn(s.app, send_timeout_s=0.5) as port:
            tokenize = json.dumps({"model": "generator", "prompt": "word " * 12000}).encode()  # a ~200 kB answer
            stream = json.dumps({"prompt": "hi", "max_new_tokens": 32, "ignore_eos": True, "stream": True}).encode()
            requests = b"".join(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: {rid}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                for path, body, rid in [("/tokenize", tokenize, "unread"), ("/v1/generate", stream, "stuck-stream")]
            )
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", port))
                await loop.sock_sendall(sock, requests)  # pipelined; then never read

                def running() -> float:
                    value: float = s.engine.metrics.running.labels(s.engine.generator.name)._value.get()
                    return value

                for _ in range(200):  # the stream is in flight and generating
                    if s.app.state.inflight.count and running():
                        break
                    await asyncio.sleep(0.01)
                assert s.app.state.inflight.count == 1 and running() == 1
                started = time.monotonic()
                while (s.app.state.inflight.count or running()) and time.monotonic() - started < 3:
                    await asyncio.sleep(0.02)
                freed_s = time.monotonic() - started
            finally:
                sock.close()
    assert s.app.state.inflight.count == 0 and running() == 0
    assert freed_s < 0.5 + 1.0
    cut = _cuts(warnings)
    cuts = [(getattr(r, "request_id", None), r.getMessage().split(":")[0]) for r in cut]
    assert cuts == [("stuck-stream", "POST /v1/generate")]
