"""Admission under the key/value cache budget: the suite's chat model (an import, so its cache is written in
place) behind a server whose SERVE_KV_CACHE_BYTES holds the worst case of a few sequences only, and a burst of
many more generations than that. Each must be answered (200) or refused with a 429, never a 5xx; no decode
step may run more sequences than the budget holds; the cache usage stays within the budget; the server lives."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from tokenizers import Tokenizer

from harness.reliability.harness import SUITE_SETTINGS, LocalServer, Outcome, client, metric, timed
from harness.reliability.suite_models import CHAT

FITS = 4  # sequences whose worst case the budget holds
BURST = 48
PROMPT = "Tell me about the harbour and the roads of the old town."
NEW_TOKENS = 24


def bytes_per_token(artifact: Path) -> int:
    dims = json.loads((artifact / "config.json").read_text())["dims"]
    return int(2 * 4 * dims["n_layers"] * dims.get("n_kv_heads", dims["n_heads"]) * dims["d_head"])


def budget(artifact: Path) -> int:
    """Bytes for FITS sequences' worst case (prompt + new tokens) and half of one more: FITS fit, not FITS + 1."""
    prompt = len(Tokenizer.from_file(str(artifact / "tokenizer.json")).encode(PROMPT).ids)
    tokens = prompt + NEW_TOKENS
    return (FITS * tokens + tokens // 2) * bytes_per_token(artifact)


@timed("kv_budget")
async def kv_budget(artifacts: Path) -> Outcome:
    out = Outcome("kv_budget")
    settings = SUITE_SETTINGS | {"SERVE_MODELS": CHAT, "SERVE_KV_CACHE_BYTES": str(budget(artifacts / CHAT)),
                                 "SERVE_PREFIX_CACHE_FRACTION": "0", "SERVE_MAX_QUEUE_SIZE": "32",
                                 "SERVE_MAX_BATCH_SIZE": "64"}
    with LocalServer(artifacts, base=settings) as server:
        target = server.wait_ready()
        body = {"model": CHAT, "prompt": PROMPT, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        async with client(target.url, connections=BURST + 4) as http:
            done = asyncio.Event()
            usage = 0.0

            async def watch() -> None:
                nonlocal usage
                while not done.is_set():
                    text = (await http.get("/metrics")).text
                    usage = max(usage, metric(text, "serve_kv_cache_usage_perc", model=CHAT))
                    await asyncio.sleep(0.05)

            watcher = asyncio.ensure_future(watch())
            answers = await asyncio.gather(*(http.post("/v1/generate", json=body) for _ in range(BURST)))
            done.set()
            await watcher
            statuses = Counter(r.status_code for r in answers)
            text = (await http.get("/metrics")).text
            alive = (await http.get("/health")).status_code == 200
        steps = metric(text, "serve_batch_size_count", model=CHAT, phase="decode")
        wider = steps - metric(text, "serve_batch_size_bucket", model=CHAT, phase="decode", le=f"{float(FITS)}")
    out.figures = {"burst": BURST, "fits": FITS, "statuses": {str(k): v for k, v in sorted(statuses.items())},
                   "decode_steps": int(steps), "steps_wider_than_fits": int(wider),
                   "peak_kv_cache_usage_perc": round(usage, 3)}
    if set(statuses) - {200, 429}:
        out.failures.append(f"answers other than 200 and 429: {dict(statuses)}")
    if statuses[200] < FITS:
        out.failures.append(f"only {statuses[200]} of {BURST} generations answered")
    if steps == 0 or wider > 0:
        out.failures.append(f"{int(wider)} of {int(steps)} decode steps ran more than the {FITS} sequences that fit")
    if not 0.0 < usage <= 1.0:
        out.failures.append(f"serve_kv_cache_usage_perc peaked at {usage}: not within (0, 1]")
    if not alive:
        out.failures.append("the server did not answer /health after the burst")
    return out
