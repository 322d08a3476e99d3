"""Traffic: concurrent clients whose answers must equal solo ones (every route of the catalogue), 10x
overload, clients that hang up, and a soak with RSS sampled."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.reliability.catalogue import SEEDED_FLIP_RATE, answer, catalogue, seeded, seeded_flip
from harness.reliability.harness import (
    Outcome,
    Target,
    client,
    gather_limited,
    metric,
    percentile,
    slope_per_minute,
    timed,
)

# --- load ---------------------------------------------------------------------------------------------


@dataclass
class _Tally:
    """What the concurrent answers were, against the same requests sent alone."""

    solo: list[Any]
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)
    mismatched: Counter[str] = field(default_factory=Counter)
    flips: int = 0
    worst_score_diff: float = 0.0

    def count(self, k: int, path: str, body: dict[str, Any], status: int, key: Any, scores: list[float]) -> None:
        self.statuses[status] += 1
        self.routes[path] += 1
        expected = self.solo[k]
        if status != 200 or expected is None:
            return
        diff = max((abs(a - b) for a, b in zip(scores, expected[1], strict=True)), default=0.0)
        self.worst_score_diff = max(self.worst_score_diff, diff)
        if key == expected[0] and diff <= 1e-3:
            return
        if seeded_flip(body, expected[0], key):
            self.flips += 1
        else:
            self.mismatched[path] += 1


@timed("load")
async def load(target: Target, requests: int = 384, concurrency: int = 64) -> Outcome:
    """`requests` from the catalogue at `concurrency`: each answer equal to its request's answer alone."""
    out = Outcome("load")
    async with client(target.url, connections=concurrency + 4) as http:
        sent = await catalogue(http)
        solo = []
        for path, body in sent:  # each one alone first
            status, key, scores, text = await answer(http, path, body)
            out.check(status == 200, f"solo {path}: {status} {text}")
            solo.append((key, scores) if status == 200 else None)
        tally = _Tally(solo)

        async def one(i: int) -> None:
            path, body = sent[i % len(sent)]
            started = time.perf_counter()
            status, key, scores, _ = await answer(http, path, body)
            tally.latencies.append(time.perf_counter() - started)
            tally.count(i % len(sent), path, body, status, key, scores)

        started = time.perf_counter()
        await gather_limited(concurrency, [one(i) for i in range(requests)])
        wall = time.perf_counter() - started
    mismatched = sum(tally.mismatched.values())
    out.figures = {
        "requests": requests,
        "concurrency": concurrency,
        "distinct": len(sent),
        "routes": dict(sorted(tally.routes.items())),
        "req_per_s": round(requests / wall, 1),
        "p50_ms": round(1000 * percentile(tally.latencies, 50)),
        "p99_ms": round(1000 * percentile(tally.latencies, 99)),
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "mismatched": mismatched,
        "seeded_flips": tally.flips,
        "max_score_diff": float(f"{tally.worst_score_diff:.2e}"),
    }
    out.check(tally.statuses[200] == requests, f"not all answered 200: {dict(tally.statuses)}")
    out.check(mismatched == 0, f"answers differ from the same request sent alone: {dict(tally.mismatched)}")
    seeded_sent = sum(1 for i in range(requests) if seeded(sent[i % len(sent)][1]))
    out.check(tally.flips <= SEEDED_FLIP_RATE * max(seeded_sent, 1),
              f"{tally.flips} of {seeded_sent} seeded answers differ from alone (at neighbouring ids)")
    return out


# --- overload -----------------------------------------------------------------------------------------


async def _solo_latency(http: httpx.AsyncClient, n: int = 5) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        response = await http.post("/v1/generate", json={"prompt": "Latency", "max_new_tokens": 4, "temperature": 0})
        response.raise_for_status()
        times.append(time.perf_counter() - started)
    return percentile(times, 50)


@timed("overload")
async def overload(target: Target, seconds: float = 6.0, factor: int = 10) -> Outcome:
    """`factor` x capacity (batch rows + queue slots) clients, each sending generations back to back."""
    out = Outcome("overload")
    queue_limit = int(target.setting("SERVE_MAX_QUEUE_SIZE", "256"))
    capacity = int(target.setting("SERVE_MAX_BATCH_SIZE", "64")) + queue_limit
    clients = factor * capacity
    statuses: dict[int, int] = {}
    missing_retry_after = 0
    peak_queue, peak_rss = 0.0, 0.0
    async with client(target.url, connections=clients + 8, timeout=60) as http:
        rss_before = target.rss_mb()
        before = await _solo_latency(http)
        stop_at = time.monotonic() + seconds

        async def hammer() -> None:
            nonlocal missing_retry_after
            while time.monotonic() < stop_at:
                response = await http.post("/v1/generate", json={"prompt": "Overload", "max_new_tokens": 8})
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code == 429:
                    missing_retry_after += "retry-after" not in response.headers
                    await asyncio.sleep(0.05)

        async def watch() -> None:
            nonlocal peak_queue, peak_rss
            while time.monotonic() < stop_at:
                text = (await http.get("/metrics")).text
                peak_queue = max(peak_queue, metric(text, "serve_queue_depth"))
                peak_rss = max(peak_rss, target.rss_mb() or 0.0)
                await asyncio.sleep(0.2)

        await asyncio.gather(watch(), *(hammer() for _ in range(clients)))
        for _ in range(100):  # the backlog drains
            if metric((await http.get("/metrics")).text, "serve_queue_depth") == 0:
                break
            await asyncio.sleep(0.1)
        after = await _solo_latency(http)
    total = sum(statuses.values())
    out.figures = {
        "clients": clients,
        "capacity": capacity,
        "requests": total,
        "ok": statuses.get(200, 0),
        "rejected_429": statuses.get(429, 0),
        "other": {str(k): v for k, v in statuses.items() if k not in (200, 429)},
        "peak_queue": int(peak_queue),
        "queue_limit": queue_limit,
        "latency_before_ms": round(1000 * before),
        "latency_after_ms": round(1000 * after),
    }
    if rss_before is not None:
        out.figures |= {"rss_before_mb": round(rss_before), "rss_peak_mb": round(peak_rss)}
    out.check(set(statuses) <= {200, 429}, f"statuses other than 200/429: {statuses}")
    out.check(statuses.get(429, 0) > 0, "no 429 at 10x capacity: the overload did not overload")
    out.check(missing_retry_after == 0, f"{missing_retry_after} 429s without Retry-After")
    out.check(peak_queue <= queue_limit, f"queue depth {peak_queue} above the limit {queue_limit}")
    out.check(after <= 2 * before + 0.1, f"latency after the overload {after:.3f}s vs {before:.3f}s before")
    return out


# --- faults: disconnects ------------------------------------------------------------------------------


async def _gauges(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    return sum(
        metric(text, name) for name in ("serve_inflight_requests", "serve_running_sequences", "serve_queue_depth")
    )


@timed("disconnects")
async def disconnects(target: Target, streams: int = 24, requests: int = 16) -> Outcome:
    """Clients that hang up mid-stream or mid-request: their slots are freed, the gauges return to 0."""
    out = Outcome("disconnects")
    async with client(target.url, connections=streams + requests + 4) as http:

        async def stream_then_hang_up() -> bool:
            body = {"prompt": "Once upon a time", "max_new_tokens": 200, "ignore_eos": True, "stream": True}
            async with http.stream("POST", "/v1/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        return True  # leaving the block closes the connection
            return False

        async def request_then_hang_up() -> None:
            body = {"prompt": "Once upon a time", "max_new_tokens": 200, "ignore_eos": True}
            with contextlib.suppress(httpx.TimeoutException):
                await http.post("/v1/generate", json=body, timeout=0.2)

        started = await asyncio.gather(*(stream_then_hang_up() for _ in range(streams)))
        await asyncio.gather(*(request_then_hang_up() for _ in range(requests)))
        hung_up = time.monotonic()
        remaining = await _gauges(http)
        while remaining and time.monotonic() - hung_up < 15:
            await asyncio.sleep(0.05)
            remaining = await _gauges(http)
        settle = time.monotonic() - hung_up
        health = (await http.get("/health")).status_code
    out.figures = {"disconnects": streams + requests, "gauges_zero_after_s": round(settle, 2), "left": remaining}
    out.check(all(started), "a stream ended before its first token")
    out.check(remaining == 0, f"gauges still at {remaining} 15 s after the clients hung up")
    out.check(health == 200, f"/health {health}")
    return out


def _half_growths(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """RSS growth over each half of the samples, each end the median of three samples (one sample is noise)."""
    if len(samples) < 12:
        return (0.0, 0.0)
    middle = len(samples) // 2

    def end(part: list[tuple[float, float]]) -> float:
        return statistics.median(v for _, v in part)

    first, second = samples[:middle], samples[middle:]
    return (end(first[-3:]) - end(first[:3]), end(second[-3:]) - end(second[:3]))


# --- soak ---------------------------------------------------------------------------------------------


@timed("soak")
async def soak(target: Target, seconds: float = 30.0, concurrency: int = 8) -> Outcome:
    """Steady mixed traffic with RSS sampled twice a second: no growth trend after the first fifth."""
    out = Outcome("soak")
    if target.pid is None:
        out.failures.append("soak needs a local server (RSS)")
        return out
    samples: list[tuple[float, float]] = []
    done = 0
    async with client(target.url, connections=concurrency + 2) as http:
        requests = await catalogue(http)
        started = time.monotonic()
        stop_at = started + seconds

        async def worker(offset: int) -> None:
            nonlocal done
            i = offset
            while time.monotonic() < stop_at:
                path, body = requests[i % len(requests)]
                response = await http.post(path, json=body)
                out.check(response.status_code == 200, f"{path}: {response.status_code}")
                done += 1
                i += concurrency

        async def sample() -> None:
            while time.monotonic() < stop_at:
                samples.append((time.monotonic() - started, target.rss_mb() or 0.0))
                await asyncio.sleep(0.5)

        await asyncio.gather(sample(), *(worker(i) for i in range(concurrency)))
    steady = [s for s in samples if s[0] >= seconds / 5]
    slope = slope_per_minute(steady)
    growth = steady[-1][1] - steady[0][1] if steady else 0.0
    halves = _half_growths(steady)
    out.failures = sorted(set(out.failures))
    out.figures = {
        "seconds": seconds,
        "requests": done,
        "rss_start_mb": round(steady[0][1], 1) if steady else None,
        "rss_end_mb": round(steady[-1][1], 1) if steady else None,
        "slope_mb_per_min": round(slope, 2),
        "half_growths_mb": [round(g, 1) for g in halves],
    }
    # A leak grows in both halves of the steady part; one allocator bump (a new arena, a pool's next slab)
    # lands in one half only.
    trend = all(g > 1.5 for g in halves) and slope > 10.0
    out.check(not trend, f"RSS grows {slope:.1f} MB/min in both halves ({halves[0]:.1f}, {halves[1]:.1f} MB)")
    out.check(growth <= 20.0, f"RSS grew {growth:.1f} MB over the steady part")
    return out
