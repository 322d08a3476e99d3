"""Our key/value cache at real size: the appended cache (the graph returns past + new) against the one the graph
writes in place (service/engine/cache/slots.py), one server at a time on the same cores, through /v1/completions.

    python -m benchmarks.kv_cache [--model smollm2-135m] [--contexts 64,1000,2000] [--streams 4,16] [--rounds 2]
                                  [--caches appended,in-place] [--work .peers-cache] [--out bench_results/kv_cache.json]

The model is a transformers checkpoint with random weights in the real model's shape (benchmarks/peers_models.py,
built once into --work), imported twice: ``--kv-cache appended`` and ``--kv-cache in-place``. Rows:
  - decode tok/s per stream (after its first token) with N streams of 96 new tokens at each prompt length;
  - time to first token of a 1,000-token prompt whose first 1,000 tokens another request just sent (the prefix
    store: SERVE_PREFIX_CACHE_FRACTION), and of a fresh one;
  - resident memory per 1,000 cached tokens while 16 streams of 2,000-token prompts decode, beside the bytes the
    cache needs (config.json's layers x key/value heads x head size x 2 x 4 bytes).
Prompts are random token ids; greedy with ignore_eos. Prints a Markdown table and writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.peers_engines import FIRST_ID, Row
from benchmarks.peers_http import complete, http_row
from benchmarks.peers_models import SHAPES, build, folder
from benchmarks.record import write_record
from benchmarks.server_process import Server

REPO = Path(__file__).resolve().parent.parent
NEW_TOKENS = 96
PREFIX = 1000
BUDGET = 8 << 30  # SERVE_KV_CACHE_BYTES: room for every row here, and a known figure for the memory row


def imported(work: Path, model: str, cache: str) -> Path:
    """The folder that serves `model` imported with `--kv-cache cache` (imported on first use)."""
    shape = SHAPES[model]
    build(work, shape, threads=2, genai=False, ct2=False)
    served = folder(work, shape) / f"ours-{cache}"
    if not (served / model / "config.json").is_file():
        checkpoint = folder(work, shape) / "hf"
        subprocess.run([sys.executable, "-m", "scripts.import_checkpoint", str(checkpoint), "--out",
                        str(served / model), "--no-int8", "--kv-cache", cache], check=True, cwd=REPO)
    return served


def ids(count: int, vocab: int, rng: np.random.Generator) -> list[int]:
    return [int(i) for i in rng.integers(FIRST_ID, vocab, count)]


async def prefix_ttft(url: str, model: str, vocab: int, rounds: int) -> dict[str, float]:
    """Time to first token of a 1,000-token prefix + 16 new tokens: once the prefix was sent before, and fresh."""
    rng = np.random.default_rng(7)
    cached, fresh = [], []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for _ in range(rounds + 1):  # the first round warms up
            prefix = ids(PREFIX, vocab, rng)
            _, first_fresh, _, _ = await complete(client, model, prefix + ids(16, vocab, rng), 2, True)
            _, first_cached, _, _ = await complete(client, model, prefix + ids(16, vocab, rng), 2, True)
            fresh.append(first_fresh)
            cached.append(first_cached)
    fresh_s, cached_s = statistics.median(fresh[1:]), statistics.median(cached[1:])
    return {"ttft_fresh_s": round(fresh_s, 3), "ttft_prefix_cached_s": round(cached_s, 3),
            "cached_over_fresh": round(cached_s / fresh_s, 3)}


async def memory_row(server: Server, model: str, vocab: int, bytes_per_token: int, budget: int) -> dict[str, float]:
    """Resident memory against the keys and values the engine holds, while 16 streams of 2,000-token prompts
    decode 96 tokens: at the moment the cache held the most (serve_kv_cache_usage_perc x the budget; an appended
    cache reports none, so only its RSS growth is recorded)."""
    idle = server.rss_mb()
    peak_rss, peak_held, rss_at_peak = idle, 0.0, idle
    row = Row("memory", "", 2000, NEW_TOKENS, 16, 16, "streams")
    task = asyncio.ensure_future(http_row(server.url, model, row, vocab, seed=11))
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        while not task.done():
            rss = server.rss_mb()
            text = (await client.get("/metrics")).text
            usage = max([float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith("serve_kv_cache_usage_perc{")] or [0.0])
            peak_rss = max(peak_rss, rss)
            if usage * budget > peak_held:
                peak_held, rss_at_peak = usage * budget, rss
            await asyncio.sleep(0.2)
    await task
    record = {"rss_growth_mb": round(peak_rss - idle, 1),
              "cache_mb_per_1000_tokens": round(bytes_per_token * 1000 / 2**20, 2)}
    if peak_held:
        tokens = peak_held / bytes_per_token
        record |= {"peak_cached_tokens": round(tokens),
                   "rss_mb_per_1000_cached_tokens": round((rss_at_peak - idle) * 1000 / tokens, 2)}
    return record


def bytes_per_token(served: Path, model: str) -> int:
    dims = json.loads((served / model / "config.json").read_text())["dims"]
    return int(2 * 4 * dims["n_layers"] * dims.get("n_kv_heads", dims["n_heads"]) * dims["d_head"])


async def measure(served: Path, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with Server(served, args.threads, models=args.model, max_input_tokens=4096, max_new_tokens=1024,
                max_queue_size=1024, request_timeout_s=3600, kv_cache_bytes=BUDGET) as server:
        for context in args.contexts if "streams" in args.parts else ():
            for streams in args.streams:
                row = Row(f"c{context}x{streams}", "", context, NEW_TOKENS, streams, streams, "streams")
                rounds = [await http_row(server.url, args.model, row, vocab, seed) for seed in range(args.rounds)]
                results[row.name] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                print(f"  {row.name}: {results[row.name]}", flush=True)
        if "prefix" in args.parts:
            results["prefix"] = await prefix_ttft(server.url, args.model, vocab, args.rounds)
            print(f"  prefix: {results['prefix']}", flush=True)
        if "memory" in args.parts:
            results["memory"] = await memory_row(server, args.model, vocab, bytes_per_token(served, args.model), BUDGET)
            print(f"  memory: {results['memory']}", flush=True)
    return results


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    caches = list(results)
    lines = [f"| row | {' | '.join(caches)} |", f"|---|{'---|' * len(caches)}"]
    for context in args.contexts if "streams" in args.parts else ():
        for streams in args.streams:
            name = f"c{context}x{streams}"
            cells = [f"{results[c][name]['decode_tokens_per_s_per_stream']} tok/s, TTFT {results[c][name]['ttft_s']} s"
                     for c in caches]  # decode rate per stream, and time to first token
            lines.append(f"| {streams} streams at {context} prompt tokens | {' | '.join(cells)} |")
    for part in ("prefix", "memory"):
        keys = dict.fromkeys(k for c in caches for k in results[c].get(part, {}))
        for key in keys:
            lines.append(f"| {key} | {' | '.join(str(results[c].get(part, {}).get(key, '')) for c in caches)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--contexts", default="64,1000,2000")
    parser.add_argument("--streams", default="4,16")
    parser.add_argument("--caches", default="appended,in-place")
    parser.add_argument("--parts", default="streams,prefix,memory", help="which rows: streams, prefix, memory")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=REPO / ".peers-cache")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "kv_cache.json")
    args = parser.parse_args()
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.streams = [int(s) for s in args.streams.split(",")]
    args.parts = args.parts.split(",")
    vocab = SHAPES[args.model].vocab_size
    results: dict[str, dict[str, Any]] = {}
    for cache in args.caches.split(","):
        print(f"{args.model}, {cache} cache:", flush=True)
        results[cache] = asyncio.run(measure(imported(args.work, args.model, cache), args, vocab))
    print(table(results, args))
    options = (("model", args.model), ("contexts", ",".join(map(str, args.contexts))),
               ("streams", ",".join(map(str, args.streams))), ("caches", args.caches), ("rounds", args.rounds))
    write_record("kv_cache", options, args.out, threads=args.threads, results=results,
                 measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


if __name__ == "__main__":
    main()
