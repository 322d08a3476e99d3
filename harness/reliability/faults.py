"""Faults in-process, so the engine can be reached: an ONNX Runtime failure mid-batch, a bug inside a request,
and slow-header clients. (SIGTERM under load: sigterm.py; broken artifacts: broken_artifacts.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from typing import Any

import httpx

from harness.reliability.harness import ARTIFACTS, Outcome, client, free_port, is_error_shape, metric, sse_events, timed

SECRET = "SECRET-PROMPT-7f3a"  # a request's text that must not reach the log


class _InProcessServer:
    """The app under uvicorn in a thread of this process, so a test can reach into its engine."""

    def __init__(self, **overrides: Any) -> None:
        import uvicorn

        from service.app import create_app
        from service.server import server_config
        from service.settings import Settings

        values: dict[str, Any] = {
            "artifacts_dir": ARTIFACTS, "intra_op_threads": 1, "inter_op_threads": 1, "max_new_tokens": 240,
        }
        self.settings = Settings(**(values | overrides))
        self.app = create_app(self.settings)
        self.port = free_port()
        config = server_config(self.app, self.settings, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("the in-process server did not become ready")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _raw_exchange(port: int, requests: list[bytes], timeout: float = 30) -> list[bytes]:
    """Send requests one after another on ONE connection; return each raw response (by content-length)."""
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        reader = sock.makefile("rb")
        for request in requests:
            sock.sendall(request)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = reader.read(1)
                if not byte:
                    answers.append(head)
                    return answers
                head += byte
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            answers.append(head + reader.read(length))
    return answers


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))



@timed("faults")
async def faults() -> Outcome:
    """An ORT failure in the middle of a decode step; a bug inside a request; a slowloris client."""
    out = Outcome("faults")
    capture = _Capture()
    capture.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logging.getLogger().addHandler(capture)
    try:
        with _InProcessServer(models=["generator", "classifier"], header_timeout_s=1.0, warmup=False) as srv:
            await _ort_failure(srv, out)
            await _internal_error(srv, out, capture)
            await _slow_headers(srv, out)
    finally:
        logging.getLogger().removeHandler(capture)
    return out


async def _ort_failure(srv: _InProcessServer, out: Outcome) -> None:
    """ORT fails once in a decode step while 6 streams and 4 plain requests share the batch: each of them
    gets an error (a 500 in our shape, or a final `error` event), and the server recovers."""
    session = srv.app.state.engine.generator.model.session
    original = session.run
    armed = threading.Event()
    fired = threading.Event()

    def failing_run(*args: Any, **kwargs: Any) -> Any:
        if armed.is_set() and not fired.is_set():
            fired.set()
            raise RuntimeError("injected ONNX Runtime failure")
        return original(*args, **kwargs)

    session.run = failing_run
    async with client(srv.url, connections=16) as http:
        body = {"prompt": "Once", "max_new_tokens": 200, "ignore_eos": True}  # still running when armed

        async def stream() -> list[tuple[str, str]]:
            async with http.stream("POST", "/v1/generate", json=body | {"stream": True}) as response:
                return await sse_events(response)

        waiters: list[asyncio.Future[list[tuple[str, str]] | httpx.Response]]
        waiters = [asyncio.ensure_future(stream()) for _ in range(6)]
        waiters += [asyncio.ensure_future(http.post("/v1/generate", json=body)) for _ in range(4)]
        for _ in range(200):
            if metric((await http.get("/metrics")).text, "serve_running_sequences") >= 10:
                break
            await asyncio.sleep(0.02)
        armed.set()
        results = await asyncio.gather(*waiters)
        got_error = 0
        for result in results:
            if isinstance(result, httpx.Response):
                got_error += result.status_code == 500 and is_error_shape(result.json())
            else:
                got_error += bool(result) and result[-1][0] == "error"
        after = await http.post("/v1/generate", json={"prompt": "after", "max_new_tokens": 3})
        health = await http.get("/health")
    out.figures["ort_failure_waiters"] = len(results)
    out.figures["ort_failure_errors"] = got_error
    out.check(fired.is_set(), "the injected failure never fired")
    out.check(got_error == len(results), f"{got_error} of {len(results)} waiters got an error")
    out.check(after.status_code == 200 and health.status_code == 200, "the server did not recover")


async def _internal_error(srv: _InProcessServer, out: Outcome, capture: _Capture) -> None:
    """A bug inside a request: JSON 500, the keep-alive connection stays usable, no request text logged."""

    def buggy(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"cannot handle {inputs}")

    srv.app.state.engine.classifier.tokenize = buggy
    request = json.dumps({"text": SECRET}).encode()
    post = (
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(request)).encode() + b"\r\n\r\n" + request
    )
    get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = await asyncio.to_thread(_raw_exchange, srv.port, [post, get, post, get])
    statuses = [a.split(b" ", 2)[1].decode() if a else "none" for a in answers]
    out.figures["internal_error_then_keepalive"] = statuses
    out.check(statuses == ["500", "200", "500", "200"], f"one connection answered {statuses}")
    out.check(b'"internal_error"' in answers[0], f"the 500 is not our JSON: {answers[0][:300]!r}")
    out.check(b"connection: close" not in answers[0].lower(), "the 500 closed the connection")
    logged = "\n".join(capture.text)
    out.check(SECRET not in logged, "the request's text is in the log")
    out.check("internal error (ValueError)" in logged, "the internal error was not logged")


def _slowloris(port: int) -> tuple[float, bytes]:
    """Headers one byte every 0.25 s: (seconds until the server closed the connection, what it answered)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        reply = b""
        with contextlib.suppress(OSError):
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n":
                sock.sendall(bytes([byte]))
                time.sleep(0.25)
        with contextlib.suppress(OSError):
            reply = sock.recv(4096)
            while chunk := sock.recv(4096):
                reply += chunk
        return time.monotonic() - started, reply


def _silent(port: int) -> float:
    """A connection that sends nothing: seconds until the server closed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass
        return time.monotonic() - started


async def _slow_headers(srv: _InProcessServer, out: Outcome) -> None:
    """Slow headers: a client that sends one byte at a time, and one that sends nothing, are cut off (408)."""
    slow_s, reply = await asyncio.to_thread(_slowloris, srv.port)
    silent_s = await asyncio.to_thread(_silent, srv.port)
    out.figures["slow_header_closed_after_s"] = round(slow_s, 2)
    out.figures["silent_connection_closed_after_s"] = round(silent_s, 2)
    out.check(b" 408 " in reply[:20], f"slow headers got {reply[:60]!r}, not 408")
    out.check(
        slow_s < 3 and silent_s < 3, f"slow connections held {slow_s:.1f}s / {silent_s:.1f}s (timeout 1 s)"
    )
