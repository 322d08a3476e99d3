"""A lean HTTP/1.1 load generator for our server: the load generator shares the CPUs with the server, so it
must be cheap. One keep-alive Connection per worker, the request of each endpoint as a Client, and `drive`,
which sends a number of requests at a concurrency and measures them as a Cell."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

TEXT = "The committee approved the new budget after a long debate about schools and roads."
PROMPT = "Once upon a time, in a small village by the sea,"


@dataclass
class Cell:
    """One endpoint at one concurrency."""

    endpoint: str
    concurrency: int
    requests: int
    seconds: float
    latencies: list[float] = field(default_factory=list, repr=False)
    ttfts: list[float] = field(default_factory=list, repr=False)
    tokens: int = 0
    errors: int = 0
    server_cores: float | None = None  # the server's CPU time / wall time during the cell
    queue_depth: float | None = None  # mean of serve_queue_depth (all models) sampled during the cell
    other_cores: float | None = None  # CPU used by everything but the server and this client: noise

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float | None:
            return round(float(np.percentile(values, q)) * 1000, 1) if values else None

        return {
            "endpoint": self.endpoint,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "requests_per_s": round(self.requests / self.seconds, 2),
            "tokens_per_s": round(self.tokens / self.seconds, 1) if self.tokens else None,
            "p50_ms": pct(self.latencies, 50),
            "p99_ms": pct(self.latencies, 99),
            "ttft_p50_ms": pct(self.ttfts, 50),
            "ttft_p99_ms": pct(self.ttfts, 99),
            "server_cores": self.server_cores,
            "queue_depth": self.queue_depth,
            "other_cores": self.other_cores,
        }


class Connection:
    """One keep-alive connection; parses Content-Length and chunked responses, counting SSE events."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.event_times: list[float] | None = None  # a list: each token event's arrival time is appended
        # a list: the arrival time of each chunk that holds token events (a server may send several tokens
        # in one chunk; the gap between chunks is what a reader of the stream waits, as vLLM's benchmark counts)
        self.chunk_times: list[float] | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, int, float | None]:
        """Returns (status, body, SSE token events, seconds to the first token event)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        started = time.perf_counter()
        self.writer.write(head.encode() + payload)
        status_line, *header_lines = (await self.reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines if line)}
        status = int(status_line.split()[1])
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"])), 0, None
        data, events, first = b"", 0, None
        while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
            chunk = (await self.reader.readexactly(size + 2))[:-2]
            data += chunk
            count = chunk.count(b"event: token")
            if count and first is None:
                first = time.perf_counter() - started
            if count and self.event_times is not None:
                self.event_times += [time.perf_counter()] * count
            if count and self.chunk_times is not None:
                self.chunk_times.append(time.perf_counter())
            events += count
        await self.reader.readexactly(2)
        return status, data, events, first

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# One request each, returning (generated tokens, time to first token or None).
Client = Callable[[Connection], Awaitable[tuple[int, float | None]]]


def _ok(status: int, data: bytes) -> Any:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
    return json.loads(data) if data[:1] == b"{" else None


async def classify(conn: Connection) -> tuple[int, float | None]:
    status, data, _, _ = await conn.post("/v1/classify", {"text": TEXT})
    _ok(status, data)
    return 0, None


def classify_with(model: str) -> Client:
    """/v1/classify on one named model (several classifiers served side by side)."""

    async def call(conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post("/v1/classify", {"text": TEXT, "model": model})
        _ok(status, data)
        return 0, None

    return call


def translate(num_beams: int, max_new_tokens: int) -> Client:
    async def call(conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post(
            "/v1/translate", {"text": TEXT, "num_beams": num_beams, "max_new_tokens": max_new_tokens}
        )
        return sum(t["output_tokens"] for t in _ok(status, data)["translations"]), None

    return call


def generate(max_new_tokens: int) -> Client:
    async def call(conn: Connection) -> tuple[int, float | None]:
        body = {"prompt": PROMPT, "max_new_tokens": max_new_tokens, "ignore_eos": True, "stream": True, "seed": 0}
        status, data, events, first = await conn.post("/v1/generate", body)
        _ok(status, data)
        if b"event: error" in data:
            raise RuntimeError("error event")
        return events, first

    return call


def completions(max_tokens: int) -> Client:
    async def call(conn: Connection) -> tuple[int, float | None]:
        body = {"model": "generator", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
        status, data, _, _ = await conn.post("/v1/completions", body)
        return _ok(status, data)["usage"]["completion_tokens"], None

    return call


async def drive(base_url: str, name: str, call: Client, concurrency: int, requests: int) -> Cell:
    """`concurrency` workers, one connection each, send `requests` requests in total back to back."""
    cell = Cell(name, concurrency, requests, 0.0)
    remaining = requests
    host, port = base_url.removeprefix("http://").split(":")
    connections = [Connection(host, int(port)) for _ in range(concurrency)]
    await asyncio.gather(*(call(c) for c in connections))  # untimed: connections, caches

    async def worker(conn: Connection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            try:
                tokens, ttft = await call(conn)
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                cell.errors += 1
                conn.close()
                conn.writer = None
                continue
            cell.latencies.append(time.perf_counter() - started)
            cell.tokens += tokens
            if ttft is not None:
                cell.ttfts.append(ttft)

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    cell.seconds = time.perf_counter() - started
    for conn in connections:
        conn.close()
    return cell


async def sample_queue_depth(base_url: str, samples: list[float], period_s: float = 0.1) -> None:
    """Append the server's total serve_queue_depth every `period_s` until cancelled: the signal the
    Kubernetes autoscaler scales on (deploy/kubernetes/components/keda-queue-depth)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as client:
        while True:
            lines = (await client.get("/metrics")).text.splitlines()
            samples.append(sum(float(x.rpartition(" ")[2]) for x in lines if x.startswith("serve_queue_depth{")))
            await asyncio.sleep(period_s)


async def drive_sampled(base_url: str, name: str, call: Client, concurrency: int, requests: int) -> Cell:
    """`drive`, with the queue depth sampled alongside."""
    samples: list[float] = []
    sampler = asyncio.create_task(sample_queue_depth(base_url, samples))
    try:
        cell = await drive(base_url, name, call, concurrency, requests)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    cell.queue_depth = round(statistics.fmean(samples), 2) if samples else None
    return cell


async def back_to_back(url: str, workers: int, requests: int, one: Callable[[Connection], Awaitable[None]]) -> None:
    """`workers` connections to `url` send `requests` requests in all, back to back: each worker calls `one`
    with its connection (one request, and whatever it records of it) until none is left."""
    host, port = url.removeprefix("http://").split(":")
    left = requests

    async def worker() -> None:
        nonlocal left
        conn = Connection(host, int(port))
        while left > 0:
            left -= 1
            await one(conn)
        conn.close()

    await asyncio.gather(*(worker() for _ in range(workers)))
