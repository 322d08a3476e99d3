"""The reliability sections. Each takes a running server (harness.Target), drives it over loopback HTTP
with bounded loops, and returns an Outcome: its figures, and what failed (an empty list is a pass).

The sections that need to start servers of their own (mismatched artifacts, injected faults) take no
target. tests/reliability/test_reliability.py runs them all in CI; `python -m tests.reliability`
runs them and writes the JSON report and the README table; tests/deploy/run.sh runs `load` and
`sigterm` against the container."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.reliability.harness import (
    ARTIFACTS,
    REPO,
    Target,
    free_port,
    gather_limited,
    is_error_shape,
    iter_sse,
    metric,
    percentile,
    slope_per_minute,
    sse_events,
)


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
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=target_url, timeout=timeout, limits=limits)


async def model_ids(http: httpx.AsyncClient) -> dict[str, str]:
    """task -> served model id (from /v1/models)."""
    data = (await http.get("/v1/models")).json()["data"]
    return {m["task"]: m["id"] for m in data}


# --- schemathesis -----------------------------------------------------------------------------------

SCHEMATHESIS_CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,negative_data_rejection"
)


@timed("schemathesis")
async def schemathesis(target: Target, max_examples: int = 10, seed: int = 1) -> Outcome:
    """Every operation of /openapi.json, positive and negative data, bounded examples per operation."""
    out = Outcome("schemathesis")
    with tempfile.TemporaryDirectory() as reports:
        command = [
            sys.executable, "-m", "schemathesis.cli", "run", f"{target.url}/openapi.json",
            "--mode", "all", "--max-examples", str(max_examples), "--seed", str(seed),
            "--checks", SCHEMATHESIS_CHECKS, "--request-timeout", "60", "--workers", "2",
            "--no-color", "--generation-database", "none", "--report", "ndjson", "--report-dir", reports,
        ]  # fmt: skip
        proc = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=900)
        requests, statuses, failures = 0, {}, set()
        for path in Path(reports).glob("*.ndjson"):
            for line in path.read_text().splitlines():
                event = json.loads(line)
                for kind, payload in event.items():
                    if kind != "ScenarioFinished":
                        continue
                    for interaction in payload.get("recorder", {}).get("interactions", {}).values():
                        response = interaction.get("response")
                        if response is not None:
                            requests += 1
                            key = f"{response['status_code'] // 100}xx"
                            statuses[key] = statuses.get(key, 0) + 1
                    for check in payload.get("recorder", {}).get("checks", {}).values():
                        for result in check:
                            if result.get("status") == "failure":
                                info = result.get("failure_info", {}).get("failure", {})
                                failures.add(f"{info.get('code')} {info.get('title')}: {info.get('operation')}")
    out.figures = {"requests": requests, "by_status": dict(sorted(statuses.items())), "failed_checks": len(failures)}
    out.figures["server_errors"] = statuses.get("5xx", 0)
    out.check(requests > 0, f"schemathesis sent no requests:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    out.failures += sorted(failures)
    out.check(proc.returncode == 0 or failures, "schemathesis failed:\n" + "\n".join(proc.stdout.splitlines()[-40:]))
    out.check(statuses.get("5xx", 0) == 0, f"{statuses.get('5xx', 0)} server errors")
    return out


# --- bad input ----------------------------------------------------------------------------------------

def _chunks(data: bytes, size: int = 65536) -> Any:
    async def gen() -> Any:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return gen()


def bad_inputs(generator: str) -> list[tuple[str, str, Any, dict[str, str]]]:
    """(name, path, body, headers): each must get a 4xx in our error shape. `body` is bytes, or an async
    iterator of bytes (a chunked body)."""
    big = b'{"text": "' + b"a" * (20 << 20) + b'"}'
    json_ = {"content-type": "application/json"}
    cases: list[tuple[str, str, Any, dict[str, str]]] = [
        ("invalid JSON", "/v1/classify", b'{"text": ', json_),
        ("invalid UTF-8", "/v1/classify", b'{"text": "\xff\xfe bad"}', json_),
        ("lone surrogate", "/v1/classify", b'{"text": "\\ud800"}', json_),
        ("lone surrogate (generate)", "/v1/generate", b'{"prompt": "a\\udfff b", "max_new_tokens": 2}', json_),
        ("lone surrogate (translate)", "/v1/translate", b'{"text": "\\udc00", "num_beams": 1}', json_),
        ("NaN", "/v1/generate", b'{"prompt": "hi", "temperature": NaN}', json_),
        ("Infinity", "/v1/generate", b'{"prompt": "hi", "top_p": Infinity}', json_),
        ("-Infinity", "/v1/translate", b'{"text": "hi", "length_penalty": -Infinity}', json_),
        ("deep nesting", "/v1/classify", b"[" * 100_000 + b"]" * 100_000, json_),
        ("deep nesting in a field", "/v1/classify", b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", json_),
        ("huge integer", "/v1/generate", b'{"prompt": "hi", "seed": 1' + b"0" * 5000 + b"}", json_),
        ("huge float", "/v1/generate", b'{"prompt": "hi", "max_new_tokens": 1e400}', json_),
        ("int64 overflow", "/v1/generate", b'{"prompt": "hi", "seed": 99999999999999999999999}', json_),
        ("token id out of vocabulary", "/v1/generate", b'{"prompt": [1, 99999999], "max_new_tokens": 2}', json_),
        ("token id beyond int64", "/v1/generate", b'{"prompt": [36893488147419103232]}', json_),
        ("negative token id", "/v1/completions", json.dumps({"model": generator, "prompt": [-1]}).encode(), json_),
        ("logit_bias superscript key", "/v1/completions",
         json.dumps({"model": generator, "prompt": "hi", "max_tokens": 2, "logit_bias": {"²": 1}}).encode(), json_),
        ("logit_bias Arabic-Indic key", "/v1/completions",
         json.dumps({"model": generator, "prompt": "hi", "max_tokens": 2, "logit_bias": {"١": 1}}).encode(), json_),
        ("logit_bias 5,000-digit key", "/v1/completions",
         json.dumps({"model": generator, "prompt": "hi", "max_tokens": 2, "logit_bias": {"9" * 5000: 1}}).encode(), json_),
        ("logit_bias id out of vocabulary", "/v1/completions",
         json.dumps({"model": generator, "prompt": "hi", "max_tokens": 2, "logit_bias": {"99999": 1}}).encode(), json_),
        ("huge list", "/v1/classify", json.dumps({"text": ["a"] * 100_000}).encode(), json_),
        ("huge stop list", "/v1/generate", json.dumps({"prompt": "hi", "stop": ["x"] * 10_000}).encode(), json_),
        ("20 MB body", "/v1/classify", big, json_),
        ("20 MB chunked body", "/v1/classify", _chunks(big), json_),
        ("chunked invalid JSON", "/v1/generate", _chunks(b'{"prompt": [' * 1000), json_),
        ("empty body", "/v1/generate", b"", json_),
        ("JSON array", "/v1/generate", b"[]", json_),
        ("JSON null", "/v1/translate", b"null", json_),
        ("unknown field", "/v1/generate", b'{"prompt": "hi", "bogus": 1}', json_),
        ("wrong type", "/v1/generate", b'{"prompt": 5}', json_),
        ("text/plain body", "/v1/classify", b"hello", {"content-type": "text/plain"}),
        ("empty text", "/v1/classify", b'{"text": ""}', json_),
        ("whitespace text", "/v1/translate", b'{"text": "   "}', json_),
        ("top_logprobs without logprobs", "/v1/generate", b'{"prompt": "hi", "top_logprobs": 3}', json_),
        ("stream with beams", "/v1/translate", b'{"text": "hi", "stream": true, "num_beams": 4}', json_),
        ("top_k above the labels", "/v1/classify", b'{"text": "hi", "top_k": 99}', json_),
        ("unknown model", "/v1/completions", b'{"model": "gpt-4", "prompt": "hi"}', json_),
    ]  # fmt: skip
    return cases


@timed("bad_input")
async def bad_input(target: Target) -> Outcome:
    out = Outcome("bad_input")
    statuses: dict[str, int] = {}
    async with client(target.url, connections=4) as http:
        generator = (await model_ids(http)).get("generation", "generator")
        for name, path, body, headers in bad_inputs(generator):
            try:
                response = await http.post(path, content=body, headers=headers)
            except httpx.HTTPError as exc:
                out.failures.append(f"{name}: no response ({type(exc).__name__})")
                continue
            statuses[name] = response.status_code
            try:
                shaped = is_error_shape(response.json())
            except ValueError:
                shaped = False
            out.check(400 <= response.status_code < 500, f"{name}: status {response.status_code}")
            out.check(shaped, f"{name}: not the error shape: {response.text[:200]}")
            health = await http.get("/health")
            out.check(health.status_code == 200, f"{name}: /health {health.status_code} afterwards")
    out.figures = {"cases": len(statuses), "statuses": dict(sorted({s: list(statuses.values()).count(s) for s in statuses.values()}.items()))}
    return out


# --- load ---------------------------------------------------------------------------------------------

PROMPTS = ("The Congress of the United", "Fellow citizens", "In the beginning", "The president said", "We the people")
SENTENCES = (
    "God said, Let there be light.",
    "And there was light.",
    "The king went to the city.",
    "In the beginning God created the heavens and the earth.",
)
REVIEWS = ("A wonderful, moving film.", "A dull, boring mess.", "The plot is thin but the acting is great.")


def deterministic_requests(ids: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """Requests whose answer must not depend on what else is in the batch: greedy and seeded sampling."""
    reqs: list[tuple[str, dict[str, Any]]] = []
    if "generation" in ids:
        for i, p in enumerate(PROMPTS):
            reqs.append(("/v1/generate", {"prompt": p, "max_new_tokens": 6 + 3 * i, "temperature": 0}))
            reqs.append(("/v1/generate", {"prompt": p, "max_new_tokens": 10, "seed": 100 + i, "top_k": 40}))
            reqs.append(("/v1/completions", {"model": ids["generation"], "prompt": p, "max_tokens": 8, "seed": 7 + i}))
    if "translation" in ids:
        for s in SENTENCES:
            reqs.append(("/v1/translate", {"text": s, "num_beams": 1, "max_new_tokens": 16}))
            reqs.append(("/v1/translate", {"text": s, "num_beams": 2, "max_new_tokens": 12}))
    if "classification" in ids:
        for r in REVIEWS:
            reqs.append(("/v1/classify", {"text": r}))
        reqs.append(("/v1/classify", {"text": [[REVIEWS[2], REVIEWS[0]], REVIEWS[1]], "top_k": 2}))
    return reqs


def answer_key(path: str, body: dict[str, Any]) -> tuple[Any, list[float]]:
    """What must be identical (texts, tokens, labels) and the scores that may differ in the last bits."""
    if path == "/v1/generate":
        return (body["text"], body["finish_reason"], body["usage"]["completion_tokens"]), []
    if path == "/v1/completions":
        return [(c["text"], c["finish_reason"]) for c in body["choices"]], []
    if path == "/v1/translate":
        return [t["text"] for t in body["translations"]], [t["score"] for t in body["translations"]]
    return [r["label"] for r in body["results"]], [p for r in body["results"] for p in r["scores"].values()]


@timed("load")
async def load(target: Target, requests: int = 384, concurrency: int = 64) -> Outcome:
    out = Outcome("load")
    async with client(target.url, connections=concurrency + 4) as http:
        catalogue = deterministic_requests(await model_ids(http))
        solo = []
        for path, body in catalogue:  # each one alone first
            response = await http.post(path, json=body)
            out.check(response.status_code == 200, f"solo {path}: {response.status_code} {response.text[:200]}")
            solo.append(answer_key(path, response.json()) if response.status_code == 200 else None)
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        mismatched = 0
        worst_score_diff = 0.0

        async def one(i: int) -> None:
            nonlocal mismatched, worst_score_diff
            k = i % len(catalogue)
            path, body = catalogue[k]
            started = time.perf_counter()
            response = await http.post(path, json=body)
            latencies.append(time.perf_counter() - started)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code != 200 or solo[k] is None:
                return
            key, scores = answer_key(path, response.json())
            diff = max((abs(a - b) for a, b in zip(scores, solo[k][1], strict=True)), default=0.0)
            worst_score_diff = max(worst_score_diff, diff)
            if key != solo[k][0] or diff > 1e-3:
                mismatched += 1

        started = time.perf_counter()
        await gather_limited(concurrency, [one(i) for i in range(requests)])
        wall = time.perf_counter() - started
    out.figures = {
        "requests": requests,
        "concurrency": concurrency,
        "distinct": len(catalogue),
        "req_per_s": round(requests / wall, 1),
        "p50_ms": round(1000 * percentile(latencies, 50)),
        "p99_ms": round(1000 * percentile(latencies, 99)),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "mismatched": mismatched,
        "max_score_diff": float(f"{worst_score_diff:.2e}"),
    }
    out.check(statuses.get(200, 0) == requests, f"not all answered 200: {statuses}")
    out.check(mismatched == 0, f"{mismatched} answers differ from the same request sent alone")
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
    capacity = int(target.setting("SERVE_MAX_BATCH_SIZE", "32")) + queue_limit
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
    return sum(metric(text, name) for name in ("serve_inflight_requests", "serve_running_sequences", "serve_queue_depth"))


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


# --- faults: SIGTERM under load -----------------------------------------------------------------------

@timed("sigterm")
async def sigterm(target: Target, long_streams: int = 10, short_streams: int = 4) -> Outcome:
    """SIGTERM while streams run: the process exits 0 within SERVE_DRAIN_TIMEOUT_S (plus process exit),
    every stream ends cleanly: `done`, or a final `error` event (`[DONE]` after an error chunk on the
    OpenAI route), never a bare cut. Consumes the server."""
    out = Outcome("sigterm")
    assert target.terminate is not None and target.wait_exit is not None
    drain = float(target.setting("SERVE_DRAIN_TIMEOUT_S", "30"))
    async with client(target.url, connections=long_streams + short_streams + 8, timeout=drain + 60) as http:
        generator = (await model_ids(http))["generation"]
        first = asyncio.Event()
        counted = 0
        total = long_streams + short_streams + 2

        async def generate(max_new: int) -> tuple[str, list[tuple[str, str]]]:
            nonlocal counted
            body = {"prompt": "Once", "max_new_tokens": max_new, "ignore_eos": True, "stream": True}
            events: list[tuple[str, str]] = []
            try:
                async with http.stream("POST", "/v1/generate", json=body) as response:
                    if response.status_code != 200:
                        return f"status {response.status_code}", events
                    async for event in iter_sse(response):
                        if not events:
                            counted += 1
                            if counted == total:
                                first.set()
                        events.append(event)
            except httpx.HTTPError as exc:
                return f"transport error {type(exc).__name__}", events
            return "ok", events

        async def completion(max_new: int) -> tuple[str, list[tuple[str, str]]]:
            nonlocal counted
            body = {"model": generator, "prompt": "Once", "max_tokens": max_new, "stream": True, "ignore_eos": True}
            events: list[tuple[str, str]] = []
            try:
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        return f"status {response.status_code}", events
                    async for event in iter_sse(response):
                        if not events:
                            counted += 1
                            if counted == total:
                                first.set()
                        events.append(event)
            except httpx.HTTPError as exc:
                return f"transport error {type(exc).__name__}", events
            return "ok", events

        max_new = int(target.setting("SERVE_MAX_NEW_TOKENS", "256")) - 16
        tasks = [asyncio.ensure_future(generate(max_new)) for _ in range(long_streams)]
        tasks += [asyncio.ensure_future(completion(max_new)) for _ in range(2)]
        tasks += [asyncio.ensure_future(generate(12)) for _ in range(short_streams)]
        await asyncio.wait_for(first.wait(), 120)
        target.terminate()
        signalled = time.monotonic()
        await asyncio.sleep(0.2)
        refused = await http.post("/v1/generate", json={"prompt": "late", "max_new_tokens": 2})
        results = await asyncio.gather(*tasks)
        status = await asyncio.to_thread(target.wait_exit, drain + 30)
        exit_s = time.monotonic() - signalled
    finished = cut = unclean = 0
    for i, (how, events) in enumerate(results):
        openai = long_streams <= i < long_streams + 2
        if how != "ok":
            unclean += 1
            out.failures.append(f"stream {i}: {how}")
            continue
        if openai:
            data = [d for _, d in events]
            errored = any('"error"' in d for d in data)
            clean = bool(data) and data[-1] == "[DONE]"
            finished += clean and not errored
            cut += clean and errored
        else:
            last = events[-1][0] if events else ""
            clean = last in ("done", "error")
            finished += last == "done"
            cut += last == "error"
        if not clean:
            unclean += 1
            out.failures.append(f"stream {i} ended without a final event: {events[-1:]}")
    out.figures = {
        "streams": len(results),
        "finished": finished,
        "cut_with_error_event": cut,
        "unclean": unclean,
        "drain_timeout_s": drain,
        "exit_after_s": round(exit_s, 2),
        "exit_status": status,
        "new_request_while_draining": refused.status_code,
    }
    out.check(status == 0, f"exit status {status}")
    out.check(exit_s <= drain + 3.0, f"exited {exit_s:.1f}s after SIGTERM; the drain timeout is {drain}s")
    out.check(refused.status_code == 503, f"a request after SIGTERM got {refused.status_code}, not 503")
    out.check(finished >= short_streams, f"only {finished} streams finished; the short ones should")
    return out


# --- faults: corrupt and mismatched artifacts ---------------------------------------------------------

def _edit_config(**changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        for key, value in changes.items():
            (config["dims"] if key in ("n_heads", "d_head", "n_layers") else config)[key] = value
        path.unlink()
        path.write_text(json.dumps(config))

    return edit


def _replace(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).unlink()
        (folder / name).write_bytes(content(data))

    return edit


ARTIFACT_CASES: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("vocab_size 4000 on an 8,000-token model", "generator", _edit_config(vocab_size=4000), "config.json"),
    ("vocab_size 9000", "generator", _edit_config(vocab_size=9000), "config.json"),
    ("max_positions 100000", "generator", _edit_config(max_positions=100000), "config.json"),
    ("wrong n_heads", "generator", _edit_config(n_heads=8), "config.json"),
    ("wrong d_head", "generator", _edit_config(d_head=32), "config.json"),
    ("wrong n_layers", "classifier", _edit_config(n_layers=2), "config.json"),
    ("classifier vocab_size too large", "classifier", _edit_config(vocab_size=9000), "config.json"),
    ("translator max_positions too large", "translator", _edit_config(max_positions=100000), "config.json"),
    ("config.json not JSON", "translator", _replace("config.json", lambda b: b[:100]), "config.json"),
    ("broken tokenizer.json", "generator", _replace("tokenizer.json", lambda b: b[: len(b) // 2]), "tokenizer.json"),
    ("truncated graph", "classifier", _replace("encoder.onnx", lambda b: b[: len(b) // 3]), "encoder.onnx"),
    ("graph replaced by zeros", "generator", _replace("decoder.onnx", lambda b: bytes(1000)), "decoder.onnx"),
]


def _broken_copy(root: Path, model: str, edit: Callable[[Path], None]) -> None:
    """Graphs are linked, not copied (edits replace a file before writing it)."""
    folder = root / model
    folder.mkdir(parents=True)
    for item in (ARTIFACTS / model).iterdir():
        if item.suffix == ".onnx":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    edit(folder)


@timed("artifacts")
async def artifacts() -> Outcome:
    """Each broken artifact: the server exits non-zero with one line naming the file, no traceback."""
    out = Outcome("artifacts")
    times = []
    for name, model, edit, file in ARTIFACT_CASES:
        with tempfile.TemporaryDirectory() as root:
            _broken_copy(Path(root), model, edit)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
            env |= {"SERVE_ARTIFACTS_DIR": root, "SERVE_MODELS": model, "SERVE_PORT": str(free_port())}
            env |= {"SERVE_HOST": "127.0.0.1", "SERVE_INTRA_OP_THREADS": "1", "SERVE_LOG_LEVEL": "warning"}
            started = time.perf_counter()
            proc = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "service"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
            )
            times.append(time.perf_counter() - started)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            last = lines[-1] if lines else ""
            out.check(proc.returncode not in (0, None), f"{name}: exit status {proc.returncode}")
            out.check(str(Path(root) / model / file) in last, f"{name}: the last line does not name {file}: {last!r}")
            out.check("Traceback" not in proc.stderr, f"{name}: a traceback instead of one line")
    out.figures = {"cases": len(ARTIFACT_CASES), "max_exit_s": round(max(times), 2)}
    return out


# --- faults in-process: an ORT failure mid-batch, an internal error, slow headers ---------------------

class _InProcessServer:
    """The app under uvicorn in a thread of this process, so a test can reach into its engine."""

    def __init__(self, **overrides: Any) -> None:
        import uvicorn

        from service.app import create_app
        from service.http_protocol import header_timeout_protocol
        from service.settings import Settings

        values = {"artifacts_dir": ARTIFACTS, "intra_op_threads": 1, "inter_op_threads": 1, "max_new_tokens": 64}
        self.settings = Settings(**(values | overrides))
        self.app = create_app(self.settings)
        self.port = free_port()
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            http=header_timeout_protocol(self.settings.header_timeout_s),
        )
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
                (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
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
    secret = "SECRET-PROMPT-7f3a"
    capture = _Capture()
    capture.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logging.getLogger().addHandler(capture)
    try:
        with _InProcessServer(models=["generator", "classifier"], header_timeout_s=1.0, warmup=False) as srv:
            engine = srv.app.state.engine
            # 1. ORT fails once in a decode step while 6 streams and 4 plain requests share the batch.
            session = engine.generator.model.session
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
                body = {"prompt": "Once", "max_new_tokens": 60, "ignore_eos": True}

                async def stream() -> list[tuple[str, str]]:
                    async with http.stream("POST", "/v1/generate", json=body | {"stream": True}) as response:
                        return await sse_events(response)

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

            # 2. A bug inside a request: JSON 500, the keep-alive connection stays usable, no request text logged.
            def buggy(inputs: Any, *args: Any, **kwargs: Any) -> Any:
                raise ValueError(f"cannot handle {inputs}")

            engine.classifier.tokenize = buggy
            request = json.dumps({"text": secret}).encode()
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
            out.check(secret not in logged, "the request's text is in the log")
            out.check("internal error (ValueError)" in logged, "the internal error was not logged")

            # 3. Slow headers: a client that sends one byte per second, and one that sends nothing.
            def slowloris() -> tuple[float, bytes]:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
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

            def silent() -> float:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                    started = time.monotonic()
                    with contextlib.suppress(OSError):
                        while sock.recv(4096):
                            pass
                    return time.monotonic() - started

            slow_s, reply = await asyncio.to_thread(slowloris)
            silent_s = await asyncio.to_thread(silent)
            out.figures["slow_header_closed_after_s"] = round(slow_s, 2)
            out.figures["silent_connection_closed_after_s"] = round(silent_s, 2)
            out.check(b" 408 " in reply[:20], f"slow headers got {reply[:60]!r}, not 408")
            out.check(slow_s < 3 and silent_s < 3, f"slow connections held {slow_s:.1f}s / {silent_s:.1f}s (timeout 1 s)")
    finally:
        logging.getLogger().removeHandler(capture)
    return out


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
        catalogue = deterministic_requests(await model_ids(http))
        started = time.monotonic()
        stop_at = started + seconds

        async def worker(offset: int) -> None:
            nonlocal done
            i = offset
            while time.monotonic() < stop_at:
                path, body = catalogue[i % len(catalogue)]
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
    out.failures = sorted(set(out.failures))
    out.figures = {
        "seconds": seconds,
        "requests": done,
        "rss_start_mb": round(steady[0][1], 1) if steady else None,
        "rss_end_mb": round(steady[-1][1], 1) if steady else None,
        "slope_mb_per_min": round(slope, 2),
    }
    out.check(slope <= 10.0, f"RSS grows {slope:.1f} MB/min")
    out.check(growth <= 20.0, f"RSS grew {growth:.1f} MB over the steady part")
    return out


# --- attention amplification --------------------------------------------------------------------------

@timed("attention")
async def attention(target: Target) -> Outcome:
    """The probe's request (many long texts with return_attention) is refused at once; the largest
    allowed one answers with a bounded body, /health stays responsive, and the memory comes back."""
    out = Outcome("attention")
    text = " ".join(["a very long and quite repetitive review of a film"] * 10)  # 122 classifier tokens (limit 128)
    limit = int(target.setting("SERVE_MAX_ATTENTION_VALUES", "1048576"))
    async with client(target.url, connections=8) as http:
        served = {m["task"]: m for m in (await http.get("/v1/models")).json()["data"]}
        if "classification" not in served:
            out.failures.append("no classifier served")
            return out
        dims = served["classification"]["dims"]
        tokens = (await http.post("/v1/classify", json={"text": text})).json()["results"][0]["input_tokens"]
        per_text = dims["n_layers"] * dims["n_heads"] * tokens * tokens
        allowed = max(1, limit // per_text)
        rss_before = target.rss_mb()

        started = time.perf_counter()
        refused = await http.post("/v1/classify", json={"text": [text] * 64, "return_attention": True})
        refused_s = time.perf_counter() - started

        health_worst = 0.0
        peak = rss_before or 0.0
        finished = asyncio.Event()

        async def probe_health() -> None:
            nonlocal health_worst, peak
            while not finished.is_set():
                t0 = time.perf_counter()
                await http.get("/health")
                health_worst = max(health_worst, time.perf_counter() - t0)
                peak = max(peak, target.rss_mb() or 0.0)
                await asyncio.sleep(0.02)

        watcher = asyncio.ensure_future(probe_health())
        started = time.perf_counter()
        big = await http.post("/v1/classify", json={"text": [text] * allowed, "return_attention": True})
        big_s = time.perf_counter() - started
        finished.set()
        await watcher
        await asyncio.sleep(1.0)
        rss_after = target.rss_mb()
    out.figures = {
        "refused_status": refused.status_code,
        "refused_ms": round(1000 * refused_s),
        "limit_values": limit,
        "allowed_texts": allowed,
        "tokens_per_text": tokens,
        "response_mb": round(len(big.content) / 1e6, 2),
        "response_s": round(big_s, 2),
        "health_worst_ms": round(1000 * health_worst),
    }
    if rss_before is not None and rss_after is not None:
        out.figures |= {"rss_before_mb": round(rss_before), "rss_peak_mb": round(peak), "rss_after_mb": round(rss_after)}
        out.check(rss_after - rss_before <= 100, f"RSS stayed {rss_after - rss_before:.0f} MB higher")
    out.check(refused.status_code in (413, 422) and is_error_shape(refused.json()), f"over the limit: {refused.status_code}")
    out.check(refused_s < 2.0, f"the refusal took {refused_s:.1f}s")
    out.check(big.status_code == 200, f"the largest allowed request got {big.status_code}")
    out.check(len(big.content) <= 12 * limit + 1_000_000, f"{len(big.content)} bytes for {limit} values")
    out.check(health_worst < 1.0, f"/health took up to {health_worst:.2f}s during the big response")
    return out
