"""List bombs: bodies under the body limit that carry one list of 100,000 items (each wrong, or each right
but too many), 8 at once on every route that takes a list, with /health timed every 10 ms from a process
of its own. Each must be refused (a 4xx in its route's error shape) without holding the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from typing import Any

from harness.reliability.harness import Outcome, Target, client, error_shaped, health_timer, model_ids, timed

ITEMS = 100_000
CLIENTS = 8
# The target of issue 45: /health answers within this while the bombs land (it took up to 14.5 s).
HEALTH_TARGET_MS = 100.0


def bombs(generator: str, items: int = ITEMS) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (path, body): one list field of each route family, `items` long."""
    xs = ["x"] * items
    return {
        "embeddings": ("/v1/embeddings", {"input": xs}),
        "embed": ("/embed", {"inputs": xs}),
        "rerank": ("/rerank", {"query": "q", "texts": xs}),
        "classify": ("/v1/classify", {"text": xs}),
        "completions": ("/v1/completions", {"model": generator, "prompt": xs}),
        "chat": ("/v1/chat/completions", {"messages": xs}),
        "chat_tools": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "tools": xs}),
        "translate": ("/v1/translate", {"text": xs}),
        "generate_stop": ("/v1/generate", {"prompt": "a", "stop": xs}),
        "tgi_stop": ("/generate", {"inputs": "a", "parameters": {"stop": xs}}),
        "tokenize": ("/tokenize", {"prompt": xs}),
    }


async def _bomb(target: Target, path: str, content: bytes, clients: int) -> dict[str, Any]:
    """`clients` copies of one bomb at once: their statuses, whether each refusal is in the route's error
    shape, the burst's time and /health's worst."""
    headers = {"content-type": "application/json"}
    async with client(target.url, connections=clients + 2, timeout=300) as http:
        await http.get("/health")  # the connections are open before the clock starts
        with health_timer(target.url, every_s=0.01, limit_s=120) as health:
            await asyncio.sleep(0.05)
            started = time.perf_counter()
            answers = await asyncio.gather(*(http.post(path, content=content, headers=headers) for _ in range(clients)))
            burst_s = time.perf_counter() - started
    shaped = 0
    for answer in answers:
        with contextlib.suppress(ValueError):  # not JSON: not shaped
            shaped += error_shaped(path, answer.json())
    return {
        "statuses": dict(sorted(Counter(str(a.status_code) for a in answers).items())),
        "shaped": shaped,
        "burst_s": round(burst_s, 2),
        "health_worst_ms": round(1000 * health[0], 1),
    }


@timed("list_bombs")
async def list_bombs(target: Target, items: int = ITEMS, clients: int = CLIENTS) -> Outcome:
    """Every bomb of `bombs`, `clients` at once: each refused with a 4xx in its route's shape, and /health
    within HEALTH_TARGET_MS throughout (the worst per route is in the figures)."""
    out = Outcome("list_bombs")
    async with client(target.url, connections=2) as http:
        generator = (await model_ids(http)).get("generation", "generator")
    routes: dict[str, Any] = {}
    for name, (path, body) in bombs(generator, items).items():
        content = json.dumps(body).encode()
        routes[name] = result = await _bomb(target, path, content, clients)
        result["body_kb"] = len(content) // 1024
        refused = all(400 <= int(status) < 500 for status in result["statuses"])
        out.check(refused, f"{name} ({path}): statuses {result['statuses']}")
        out.check(result["shaped"] == clients, f"{name}: {clients - result['shaped']} answers not in the error shape")
        out.check(result["health_worst_ms"] <= HEALTH_TARGET_MS,
                  f"{name}: /health took up to {result['health_worst_ms']:.0f} ms (target {HEALTH_TARGET_MS:.0f})")
    worst = max(routes.items(), key=lambda item: item[1]["health_worst_ms"])
    out.figures = {
        "items": items,
        "clients": clients,
        "health_target_ms": HEALTH_TARGET_MS,
        "health_worst_ms": worst[1]["health_worst_ms"],
        "worst_route": worst[0],
        "routes": routes,
    }
    return out
