"""What bursts leave the server holding: 96 concurrent requests on each route in turn (embeddings, /embed,
classify, generate with 200 tokens, tokenize, chat), then 10 s idle; the server's RSS (its front-end
processes' too) must come back within MEMORY_BOUND_MB of what it was before the first burst."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from harness.reliability.harness import Outcome, Target, client, model_ids, served, timed, tree_rss_mb
from harness.reliability.suite_models import CHAT

# RSS 10 s after the bursts over RSS before them: the target of issue 45 (the probe measured +880 MB kept).
MEMORY_BOUND_MB = 150.0
BURST = 96
SETTLE_S = 10.0
# The section's server: the default batch and queue, so that a burst is admitted as the container admits it.
MEMORY_SETTINGS = {"SERVE_MAX_BATCH_SIZE": "64", "SERVE_MAX_QUEUE_SIZE": "256"}

TEXT = (
    "The committee approved the new budget after a long debate about schools, roads and the harbour; "
    "the vote was close and several members asked for the figures to be checked again next spring."
)


def burst_routes(ids: dict[str, str], models: set[str], max_new_tokens: int = 200) -> dict[str, tuple[str, Any]]:
    """name -> (path, body) of each route whose model is served."""
    routes: dict[str, tuple[str, Any]] = {}
    if "embedding" in ids:
        routes["embeddings"] = ("/v1/embeddings", {"input": TEXT})
        routes["embed"] = ("/embed", {"inputs": TEXT})
    if "classification" in ids:
        routes["classify"] = ("/v1/classify", {"text": TEXT})
    if "generation" in ids:
        body = {"prompt": "Once upon a time", "max_new_tokens": max_new_tokens, "ignore_eos": True, "seed": 0}
        routes["generate"] = ("/v1/generate", body)
        routes["tokenize"] = ("/tokenize", {"prompt": TEXT})
    if CHAT in models:
        messages = [{"role": "user", "content": "Where is the train station?"}]
        routes["chat"] = ("/v1/chat/completions", {"model": CHAT, "messages": messages, "max_tokens": max_new_tokens})
    return routes


async def _burst(target: Target, pid: int, path: str, body: Any, clients: int) -> dict[str, Any]:
    """`clients` copies of one request at once: their statuses, the time, and RSS before, at the peak and after."""
    async with client(target.url, connections=clients + 2, timeout=300) as http:
        before = tree_rss_mb(pid)
        peak = before
        done = asyncio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, tree_rss_mb(pid))
                await asyncio.sleep(0.05)

        sampler = asyncio.ensure_future(sample())
        started = time.perf_counter()
        answers = await asyncio.gather(*(http.post(path, json=body) for _ in range(clients)))
        burst_s = time.perf_counter() - started
        done.set()
        await sampler
    return {
        "statuses": dict(sorted(Counter(str(a.status_code) for a in answers).items())),
        "burst_s": round(burst_s, 2),
        "rss_before_mb": round(before),
        "rss_peak_mb": round(peak),
        "rss_after_mb": round(tree_rss_mb(pid)),
    }


@timed("memory")
async def memory(target: Target, clients: int = BURST, settle_s: float = SETTLE_S) -> Outcome:
    """A burst of `clients` on each route of `burst_routes` in turn, then `settle_s` idle: RSS within
    MEMORY_BOUND_MB of the start; only 200 or 429 answers."""
    out = Outcome("memory")
    if target.pid is None:
        out.failures.append("memory needs a local server (RSS)")
        return out
    async with client(target.url, connections=2) as http:
        routes = burst_routes(await model_ids(http), await served(http))
    start = tree_rss_mb(target.pid)
    results: dict[str, Any] = {}
    for name, (path, body) in routes.items():
        results[name] = result = await _burst(target, target.pid, path, body, clients)
        ok = set(result["statuses"]) <= {"200", "429"} and "200" in result["statuses"]
        out.check(ok, f"{name} ({path}): statuses {result['statuses']}")
    await asyncio.sleep(settle_s)
    end = tree_rss_mb(target.pid)
    out.figures = {
        "clients": clients,
        "settle_s": settle_s,
        "rss_start_mb": round(start),
        "rss_peak_mb": max((r["rss_peak_mb"] for r in results.values()), default=round(start)),
        "rss_end_mb": round(end),
        "kept_mb": round(end - start),
        "bound_mb": MEMORY_BOUND_MB,
        "routes": results,
    }
    out.check(bool(routes), "no route to burst: no model served")
    out.check(end - start <= MEMORY_BOUND_MB, f"RSS {end - start:.0f} MB above the start {settle_s:.0f} s after "
              f"the bursts (bound {MEMORY_BOUND_MB:.0f})")  # fmt: skip
    return out
