"""Inter-token latency of running streams while long prompts join: chunked prefill on and off (issue 11, item 4).

    python -m benchmarks.itl [--artifacts DIR] [--chunks 0,64] [--rounds 3] [--out bench_results/itl.json]

One server per SERVE_PREFILL_CHUNK_TOKENS value (SERVE_INTRA_OP_THREADS=--threads), generator only. Each round,
on each server in turn: --streams clients stream completions of a --prompt-tokens prompt and --new-tokens
tokens back to back (--requests in all), while one more client sends --long-tokens-token prompts for 4 tokens
each, back to back with a 50 ms pause. Printed: throughput of the streams, their inter-token gaps (p50, p99,
p99.9), how many long prompts went through, and the long prompts' latency; medians over rounds.
Pause trainings first: the numbers move with anything else on the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from benchmarks.http_load import Connection, _ok, back_to_back
from benchmarks.options import measurement_options
from benchmarks.record import write_record
from benchmarks.server_process import Server


def prompt(n: int, first: int) -> list[int]:
    """n token ids from `first` on, kept below 250 (the tiny test vocabulary has 300)."""
    return [5 + (first + i) % 245 for i in range(n)]


async def load(url: str, args: argparse.Namespace) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    stream = {"model": "generator", "prompt": prompt(args.prompt_tokens, 100), "stream": True,
              "max_new_tokens": args.new_tokens, "ignore_eos": True, "temperature": 0.0}
    long = {"model": "generator", "prompt": prompt(args.long_tokens, 0), "max_new_tokens": 4,
            "ignore_eos": True, "temperature": 0.0}
    gaps: list[float] = []
    long_latency: list[float] = []
    tokens, done = 0, False

    async def streamed(conn: Connection) -> None:
        nonlocal tokens
        conn.event_times = []
        status, data, events, _ = await conn.post("/v1/generate", stream)
        _ok(status, data)
        gaps.extend(np.diff(conn.event_times))
        tokens += events

    async def long_prompts() -> None:
        conn = Connection(host, int(port))
        while not done:
            started = time.perf_counter()
            status, data, _, _ = await conn.post("/v1/generate", long)
            _ok(status, data)
            long_latency.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)
        conn.close()

    started = time.perf_counter()
    side = asyncio.ensure_future(long_prompts())
    await back_to_back(url, args.streams, args.requests, streamed)
    seconds = time.perf_counter() - started
    done = True
    await side
    ms = np.asarray(gaps) * 1000
    return {"tok_s": tokens / seconds, "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "p999": float(np.percentile(ms, 99.9)), "long_prompts": len(long_latency),
            "long_latency_ms": 1000 * statistics.median(long_latency)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    measurement_options(parser, "itl", rounds=3)
    parser.add_argument("--chunks", default="0,64", help="SERVE_PREFILL_CHUNK_TOKENS values, comma-separated")
    parser.add_argument("--streams", type=int, default=15)
    parser.add_argument("--requests", type=int, default=120, help="streamed requests per measurement")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--long-tokens", type=int, default=200)
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    servers = {c: Server(args.artifacts, args.threads, models="generator", prefill_chunk_tokens=c,
                         max_new_tokens=max(args.new_tokens, 256)) for c in chunks}
    rounds: list[dict[int, dict[str, float]]] = []
    try:
        for server in servers.values():
            server.wait_ready()
        for server in servers.values():  # untimed: connections, caches
            asyncio.run(load(server.url, argparse.Namespace(**{**vars(args), "requests": args.streams})))
        for i in range(args.rounds):
            rounds.append({c: asyncio.run(load(server.url, args)) for c, server in servers.items()})
            print(f"round {i + 1}: " + "; ".join(f"chunk {c}: p99 {r['p99']:.1f} ms" for c, r in rounds[-1].items()),
                  flush=True)
    finally:
        for server in servers.values():
            server.proc.kill()
    summary = {c: {k: round(statistics.median(r[c][k] for r in rounds), 2) for k in rounds[0][c]} for c in chunks}
    print("\n| SERVE_PREFILL_CHUNK_TOKENS | streams tok/s | ITL p50 ms | p99 ms | p99.9 ms | p99/p50 | long prompts "
          "| long prompt latency ms |\n|---|---|---|---|---|---|---|---|")
    for c, s in summary.items():
        ratio = f"{s['p99'] / s['p50']:.2f}" if s["p50"] >= 0.01 else "-"  # a tiny test model's gaps round to 0
        print(f"| {c} | {s['tok_s']:,.0f} | {s['p50']} | {s['p99']} | {s['p999']} | {ratio} | "
              f"{s['long_prompts']:.0f} | {s['long_latency_ms']} |")
    options = tuple((k.replace("_", "-"), v) for k, v in vars(args).items())
    print()
    write_record("itl", options, args.out, summary=summary, rounds=rounds)


if __name__ == "__main__":
    main()
