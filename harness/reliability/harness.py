"""What the reliability sections run against: a server process started here (`python -m service` on a
loopback port, RSS read from /proc) or one already running (a container: a URL, and a command that sends
it SIGTERM). Plus the small HTTP and /metrics helpers the sections share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import httpx

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"

# The settings the suite's own servers run with: small limits, so that queues and long streams are cheap
# to reach on a 2-core CI machine.
SUITE_SETTINGS = {
    "SERVE_INTRA_OP_THREADS": "1",
    "SERVE_INTER_OP_THREADS": "1",
    "SERVE_MAX_NEW_TOKENS": "240",
    "SERVE_MAX_BATCH_SIZE": "8",
    "SERVE_MAX_QUEUE_SIZE": "64",  # load runs 64 clients; `overload` runs on a server with a smaller queue
    "SERVE_MAX_WAIT_MS": "2",
    "SERVE_DRAIN_TIMEOUT_S": "3",
    "SERVE_LOG_LEVEL": "warning",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    return int(match.group(1)) / 1024 if match else float("nan")


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and its children (the front ends of SERVE_API_PROCESSES > 1), from /proc."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total = rss_mb(pid)
    for child in children:
        with contextlib.suppress(OSError):  # a child that just exited
            total += rss_mb(int(child))
    return total


def wait_until_ready(proc: subprocess.Popen[Any], url: str, timeout: float, poll_s: float,
                     output: Callable[[], str] | None = None) -> None:
    """Until GET {url}/ready answers 200. RuntimeError where the process exits first, TimeoutError after
    `timeout` seconds; either message ends with the last of `output` (the server's log), if given."""
    def tail() -> str:
        return f":\n{output()[-3000:]}" if output is not None else ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"the server was not ready after {timeout}s{tail()}")


@dataclass
class Target:
    """A running server. `pid` is set when this process started it (RSS and exit status are readable);
    `terminate` sends SIGTERM, `wait_exit(timeout)` returns the exit status."""

    url: str
    settings: dict[str, str]
    pid: int | None = None
    terminate: Callable[[], None] | None = None
    wait_exit: Callable[[float], int] | None = None
    stderr: Callable[[], str] = field(default=lambda: "")

    def setting(self, name: str, default: str) -> str:
        return self.settings.get(name, default)

    def rss_mb(self) -> float | None:
        return rss_mb(self.pid) if self.pid is not None else None


class LocalServer:
    """`python -m service` in a child process, on a free loopback port."""

    def __init__(self, artifacts: Path = ARTIFACTS, base: dict[str, str] = SUITE_SETTINGS, **overrides: str) -> None:
        self.port = free_port()
        self.settings = {**base, **overrides}
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
        env |= {"SERVE_HOST": "127.0.0.1", "SERVE_PORT": str(self.port), "SERVE_ARTIFACTS_DIR": str(artifacts)}
        env |= self.settings
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def target(self) -> Target:
        return Target(
            self.url,
            self.settings,
            pid=self.proc.pid,
            terminate=lambda: self.proc.send_signal(signal.SIGTERM),
            wait_exit=lambda timeout: self.proc.wait(timeout=timeout),
            stderr=self.output,
        )

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self, timeout: float = 120.0) -> Target:
        wait_until_ready(self.proc, self.url, timeout, poll_s=0.1, output=self.output)
        return self.target()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of one Prometheus metric whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, rest = head.partition("{")
        if sample != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


def is_error_shape(body: Any) -> bool:
    """The project's error shape, or OpenAI's on the OpenAI routes: both have error.type and error.message."""
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)


def is_tei_error_shape(body: Any) -> bool:
    """TEI's error body, on /embed and /rerank: {"error": message, "error_type": kind}."""
    return isinstance(body, dict) and isinstance(body.get("error"), str) and isinstance(body.get("error_type"), str)


def error_shaped(path: str, body: Any) -> bool:
    """The error shape `path` answers with: TEI's on its routes, ours (or OpenAI's) everywhere else."""
    return is_tei_error_shape(body) if path in ("/embed", "/rerank") else is_error_shape(body)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    var = sum((t - mx) ** 2 for t, _ in samples)
    return 60 * sum((t - mx) * (v - my) for t, v in samples) / var if var else 0.0


async def iter_sse(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a Server-Sent Events response, as they arrive."""
    name, data = "message", []
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield name, "\n".join(data)
            name, data = "message", []
    if data:
        yield name, "\n".join(data)


async def sse_events(response: httpx.Response) -> list[tuple[str, str]]:
    return [event async for event in iter_sse(response)]


async def gather_limited(limit: int, coroutines: list[Any]) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def run(coroutine: Any) -> Any:
        async with semaphore:
            return await coroutine

    return await asyncio.gather(*(run(c) for c in coroutines))


# `overload` gets its own server with a small queue: 10x capacity stays a few hundred clients.
# 240 clients connect at once; on a starved CI machine the client can take longer than the default 10 s
# header timeout to write some of their first requests, and the server's 408 + close then reads as a
# connection error. This section is about the queue, not slow clients (slow_clients covers those).
OVERLOAD_SETTINGS = {
    "SERVE_MAX_BATCH_SIZE": "8",
    "SERVE_MAX_QUEUE_SIZE": "16",
    "SERVE_HEADER_TIMEOUT_S": "120",
    "SERVE_BODY_TIMEOUT_S": "120",
}


@dataclass
class Outcome:
    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def check(self, ok: bool, failure: str) -> None:
        if not ok:
            self.failures.append(failure)


def timed(name: str) -> Callable[[Callable[..., Awaitable[Outcome]]], Callable[..., Awaitable[Outcome]]]:
    def wrap(fn: Callable[..., Awaitable[Outcome]]) -> Callable[..., Awaitable[Outcome]]:
        async def run(*args: Any, **kwargs: Any) -> Outcome:
            started = time.perf_counter()
            outcome = await fn(*args, **kwargs)
            outcome.name = name
            outcome.seconds = round(time.perf_counter() - started, 1)
            return outcome

        run.__name__ = fn.__name__
        return run

    return wrap


def client(target_url: str, connections: int = 100, timeout: float = 120.0) -> httpx.AsyncClient:
    # httpx's own pool expiry (5 s): the server keeps idle connections longer (SERVE_KEEPALIVE_TIMEOUT_S),
    # so a request never goes out on a connection the server is closing (with uvicorn's old 5 s, 1-2 POSTs
    # in 2,000 failed with ReadError under overload).
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=target_url, timeout=timeout, limits=limits)


async def model_ids(http: httpx.AsyncClient) -> dict[str, str]:
    """task -> the served model that answers requests naming none (from /v1/models)."""
    data = (await http.get("/v1/models")).json()["data"]
    return {m["task"]: m["id"] for m in data if m.get("default", True)}


async def served(http: httpx.AsyncClient) -> set[str]:
    """The ids of the served models."""
    return {m["id"] for m in (await http.get("/v1/models")).json()["data"]}


# /health is timed from a process of its own: a client that reads megabytes of maps or writes megabytes of
# bodies in the same event loop (or the same interpreter) would time itself, not the server.
_HEALTH_TIMER = """
import http.client, select, sys, time
conn, worst = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=float(sys.argv[4])), 0.0
print("ready", flush=True)
while not select.select([sys.stdin], [], [], float(sys.argv[3]))[0]:
    started = time.perf_counter()
    conn.request("GET", "/health")
    conn.getresponse().read()
    worst = max(worst, time.perf_counter() - started)
print(worst, flush=True)
"""


@contextlib.contextmanager
def health_timer(url: str, every_s: float = 0.02, limit_s: float = 60.0) -> Iterator[list[float]]:
    """GET /health every `every_s` while the block runs; the worst time (s) is in the yielded list after it:
    inf where a request failed or took longer than `limit_s`."""
    address = urlsplit(url)
    host, port = address.hostname or "127.0.0.1", str(address.port or 80)
    timer = subprocess.Popen(
        [sys.executable, "-c", _HEALTH_TIMER, host, port, str(every_s), str(limit_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert timer.stdout is not None and timer.stdout.readline().strip() == "ready"
    worst: list[float] = []
    try:
        yield worst
    finally:
        out, _ = timer.communicate("stop\n", timeout=limit_s + 30)
        worst.append(float(out.strip() or "inf"))  # nothing printed: the timer failed (no server to ask)
