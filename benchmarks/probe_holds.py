"""What a burst of requests makes a server hold: RSS and /health latency of a real `python -m service`
(the committed artifacts, default settings unless given) during and after

- `attention`: N concurrent largest-allowed `return_attention` requests (/v1/classify, one text at the
  longest length SERVE_MAX_ATTENTION_VALUES lets through), RSS sampled until 10 s after each burst;
- `tokenize`: N concurrent /tokenize requests of about 900 KB each;
- `classify`: N concurrent plain /v1/classify requests (one short text, no attention), requests/s of each
  burst: what a setting that changes the allocator (MALLOC_ARENA_MAX) costs the hot path.

    python -m benchmarks.probe_holds attention --concurrency 96 --bursts 2
    python -m benchmarks.probe_holds tokenize --concurrency 8
    python -m benchmarks.probe_holds classify --concurrency 96 --bursts 20 --setting MALLOC_ARENA_MAX=2
    python -m benchmarks.probe_holds attention --setting SERVE_MAX_ATTENTION_VALUES_IN_FLIGHT=2097152

Prints one JSON object of figures. /health is timed from a process of its own (the reliability suite's
`health_timer`): a client that reads megabytes of attention maps in the same event loop would time itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

import httpx

from harness.reliability.bursts import TOKENIZE_PROMPT
from harness.reliability.harness import LocalServer, health_timer, rss_mb

REVIEW = "a very long and quite repetitive review of a film "


class ProbedServer(LocalServer):
    def rss(self) -> float:
        return rss_mb(self.proc.pid)


def _client(server: ProbedServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, timeout=300, limits=httpx.Limits(max_connections=None))


async def _longest_allowed(http: httpx.AsyncClient) -> str:
    """The longest repetition of REVIEW one classify request with attention may carry."""
    best = REVIEW
    for repeats in range(1, 40):
        text = REVIEW * repeats
        r = await http.post("/v1/classify", json={"text": text, "return_attention": True})
        if r.status_code != 200:
            break
        best = text
    return best


async def _attention_burst(server: ProbedServer, http: httpx.AsyncClient, text: str, n: int) -> dict[str, Any]:
    before = server.rss()
    stop, peak = asyncio.Event(), [before]

    async def sample() -> None:
        while not stop.is_set():
            peak.append(server.rss())
            await asyncio.sleep(0.05)

    async def one() -> tuple[int, int]:
        r = await http.post("/v1/classify", json={"text": text, "return_attention": True})
        return r.status_code, len(r.content)

    with health_timer(server.url) as worst:
        sampler = asyncio.ensure_future(sample())
        started = time.perf_counter()
        answers = await asyncio.gather(*(one() for _ in range(n)))
        ended = time.perf_counter()
        stop.set()
        await sampler
    after = {}
    for t in (1, 5, 10):
        await asyncio.sleep(max(0.0, t - (time.perf_counter() - ended)))
        after[f"rss_after_{t}s_mb"] = round(server.rss())
    return {
        "statuses": dict(Counter(s for s, _ in answers)),
        "response_mb": round(max(size for _, size in answers) / 1e6, 2),
        "burst_s": round(ended - started, 1),
        "rss_before_mb": round(before),
        "rss_peak_mb": round(max(peak)),
        **after,
        "health_worst_ms": round(1000 * worst[0]),
    }


async def attention(server: ProbedServer, concurrency: int, bursts: int) -> dict[str, Any]:
    async with _client(server) as http:
        text = await _longest_allowed(http)
        await asyncio.sleep(2.0)
        figures: dict[str, Any] = {"concurrency": concurrency, "rss_baseline_mb": round(server.rss())}
        for burst in range(bursts):
            figures[f"burst_{burst + 1}"] = await _attention_burst(server, http, text, concurrency)
    return figures


async def tokenize(server: ProbedServer, concurrency: int) -> dict[str, Any]:
    async with _client(server) as http:
        baseline = server.rss()

        async def one() -> tuple[int, str]:
            r = await http.post("/tokenize", json={"prompt": TOKENIZE_PROMPT})
            return r.status_code, str(r.json()["count"]) if r.status_code == 200 else r.text[:200]

        with health_timer(server.url) as worst:
            started = time.perf_counter()
            answers = await asyncio.gather(*(one() for _ in range(concurrency)))
            burst_s = time.perf_counter() - started
        await asyncio.sleep(1.0)
        rss_after = server.rss()
    return {
        "concurrency": concurrency,
        "prompt_bytes": len(TOKENIZE_PROMPT),
        "statuses": dict(Counter(s for s, _ in answers)),
        "first_answer": answers[0][1],
        "burst_s": round(burst_s, 2),
        "health_worst_ms": round(1000 * worst[0]),
        "rss_baseline_mb": round(baseline),
        "rss_after_1s_mb": round(rss_after),
    }


async def classify(server: ProbedServer, concurrency: int, bursts: int) -> dict[str, Any]:
    async with _client(server) as http:
        baseline = server.rss()
        rates: list[float] = []
        statuses, peak = Counter[int](), baseline
        body = {"text": REVIEW}
        for burst in range(bursts + 1):  # the first one opens the connections: not counted
            started = time.perf_counter()
            answers = await asyncio.gather(*(http.post("/v1/classify", json=body) for _ in range(concurrency)))
            if burst:
                rates.append(concurrency / (time.perf_counter() - started))
            statuses.update(r.status_code for r in answers)
            peak = max(peak, server.rss())
        await asyncio.sleep(1.0)
        rss_after = server.rss()
    ranked = sorted(rates)
    return {
        "concurrency": concurrency,
        "bursts": bursts,
        "statuses": dict(statuses),
        "requests_per_s_median": round(ranked[len(ranked) // 2]),
        "requests_per_s_best": round(ranked[-1]),
        "requests_per_s": [round(r) for r in rates],  # in burst order: a noisy machine shows here
        "rss_baseline_mb": round(baseline),
        "rss_peak_mb": round(peak),
        "rss_after_1s_mb": round(rss_after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=["attention", "tokenize", "classify"])
    parser.add_argument("--concurrency", type=int, default=None, help="default: 96 (attention, classify), 8 (tokenize)")
    parser.add_argument("--bursts", type=int, default=1, help="attention, classify: bursts one after the other")
    parser.add_argument("--setting", action="append", default=[], help="NAME=VALUE for the server")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.setting)
    concurrency = args.concurrency or (8 if args.probe == "tokenize" else 96)
    with ProbedServer(base={"SERVE_LOG_LEVEL": "warning"}, **settings) as server:
        server.wait_ready(timeout=300)
        if args.probe == "attention":
            figures = asyncio.run(attention(server, concurrency, args.bursts))
        elif args.probe == "classify":
            figures = asyncio.run(classify(server, concurrency, args.bursts))
        else:
            figures = asyncio.run(tokenize(server, concurrency))
    print(json.dumps({"probe": args.probe, "settings": settings, **figures}))


if __name__ == "__main__":
    main()
