"""Benchmark the inference service end to end.

    python -m benchmarks.serving [--artifacts artifacts] [--threads 0] [--scale 1.0] [--out bench_results]

Starts `python -m service` on a free port and drives it with concurrent HTTP clients: requests/s,
tokens/s, p50/p99 latency and time to first token at concurrency 1, 8 and 32 for each endpoint.
Then, side by side in the same run:
  - dynamic batching on vs off (SERVE_MAX_BATCH_SIZE=1): classify throughput at concurrency 32,
  - continuous batching vs one sequence at a time: generated tokens/s with 16 concurrent streams,
  - KV-cache decoding vs recomputing the prefix every step (generator graph, in process).
Prints a Markdown table and writes the JSON to <out>/bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cpu_time import client_cpu_seconds, machine_cpu_seconds
from benchmarks.http_load import (
    Cell,
    Client,
    classify,
    classify_with,
    completions,
    drive,
    drive_sampled,
    generate,
    translate,
)
from benchmarks.server_process import Server
from service.runtime.artifact import load_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = (1, 8, 32)


# --- KV cache vs recompute (in process, on the generator graph) --------------------------------------


def kv_cache_vs_recompute(artifacts: Path, threads: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    artifact = load_artifact(artifacts / "generator")
    session = GraphSession(
        "generator", artifact.graphs["decoder"], RuntimeOptions(device="cpu", intra_op_threads=threads)
    )
    L, H, Dh = artifact.n_decoder_layers, artifact.n_kv_heads, artifact.d_head
    names = [f"{i}.{p}" for i in range(L) for p in ("key", "value")]
    ids = list(np.random.default_rng(0).integers(10, artifact.vocab_size, prompt_len))

    def feeds(tokens: list[int], start: int, past: list[Any]) -> dict[str, Any]:
        T = start + len(tokens)
        out: dict[str, Any] = {
            "input_ids": np.array([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, T), dtype=np.int64),
            "position_ids": np.arange(start, T, dtype=np.int64)[None],
        }
        return out | dict(zip((f"past_key_values.{n}" for n in names), past, strict=True))

    empty = [np.zeros((1, H, 0, Dh), dtype=np.float32)] * (2 * L)
    present = [f"present.{n}" for n in names]

    def cached() -> list[int]:
        tokens = list(ids)
        out = session.run(feeds(tokens, 0, empty), ["logits", *present])
        for _ in range(new_tokens):
            tokens.append(int(np.argmax(out["logits"][0, -1])))
            past = [out[n] for n in present]
            out = session.run(feeds(tokens[-1:], len(tokens) - 1, past), ["logits", *present])
        return tokens

    def recompute() -> list[int]:
        tokens = list(ids)
        for _ in range(new_tokens):
            out = session.run(feeds(tokens, 0, empty), ["logits"])
            tokens.append(int(np.argmax(out["logits"][0, -1])))
        return tokens

    timings = {}
    for name, fn in (("kv_cache", cached), ("recompute", recompute)):
        fn()  # warm-up
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            result = fn()
            runs.append(time.perf_counter() - started)
        timings[name] = (statistics.median(runs), result)
    assert timings["kv_cache"][1] == timings["recompute"][1], "cached and recomputed greedy tokens differ"
    cached_s, recompute_s = timings["kv_cache"][0], timings["recompute"][0]
    return {
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "kv_cache_tokens_per_s": round(new_tokens / cached_s, 1),
        "recompute_tokens_per_s": round(new_tokens / recompute_s, 1),
        "speedup": round(recompute_s / cached_s, 2),
    }


# --- the run -----------------------------------------------------------------------------------------


def run_matrix(
    server: Server, clients: dict[str, Client], scale: float, concurrency: tuple[int, ...] = CONCURRENCY
) -> list[Cell]:
    cells = []
    for name, call in clients.items():
        for c in concurrency:
            requests = max(c * 2, round(c * 4 * scale), 8)
            before = (time.perf_counter(), server.cpu_seconds(), machine_cpu_seconds(), client_cpu_seconds())
            cell = asyncio.run(drive_sampled(server.url, name, call, c, requests))
            after = (time.perf_counter(), server.cpu_seconds(), machine_cpu_seconds(), client_cpu_seconds())
            # Over the whole call (its untimed warm-up requests too): CPU time / the same wall time.
            wall_s, server_s, machine_s, client_s = (a - b for a, b in zip(after, before, strict=True))
            cell.server_cores = round(server_s / wall_s, 2)
            cell.other_cores = round(max(0.0, machine_s - server_s - client_s) / wall_s, 2)
            print(f"  {name:<12} c={c:<3} {cell.summary()['requests_per_s']:>8} req/s", flush=True)
            cells.append(cell)
    return cells


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        "endpoint", "concurrency", "requests_per_s", "tokens_per_s", "p50_ms", "p99_ms", "ttft_p50_ms", "server_cores",
        "queue_depth", "other_cores", "errors",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)



def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--threads", type=int, default=0, help="SERVE_INTRA_OP_THREADS (0: ORT default)")
    parser.add_argument("--scale", type=float, default=1.0, help="requests per cell, relative")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generated tokens per generation request")
    parser.add_argument(
        "--concurrency",
        type=lambda text: tuple(int(c) for c in text.split(",")),
        default=CONCURRENCY,
        help="comma-separated concurrency levels of the endpoint matrix",
    )
    parser.add_argument("--quantization", choices=("none", "int8"), default="none", help="SERVE_QUANTIZATION")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="SERVE_DEVICE")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results")
    parser.add_argument("--classifiers", default="", help="comma-separated classifiers to measure side by side "
                        "(e.g. classifier,classifier-minilm): a `classify <name>` row each, in the same server")
    args = parser.parse_args()
    if 32 not in args.concurrency:
        parser.error("--concurrency must include 32 (the batching comparison runs at 32)")
    missing = [
        m for m in ("translator", "generator", "classifier") if not (args.artifacts / m / "config.json").is_file()
    ]
    if missing:
        parser.error(
            f"{args.artifacts} lacks {missing}; pass --artifacts "
            "(e.g. from `python -m scripts.export --tiny --out DIR`)"
        )
    return args


def endpoint_clients(args: argparse.Namespace) -> dict[str, Client]:
    """The endpoint matrix's rows: each endpoint's request, and one per classifier of --classifiers."""
    n = args.max_new_tokens
    clients: dict[str, Client] = {
        "classify": classify,
        "translate": translate(num_beams=4, max_new_tokens=min(n, 48)),
        "generate": generate(n),
        "completions": completions(n),
    }
    clients |= {f"classify {name}": classify_with(name) for name in filter(None, args.classifiers.split(","))}
    return clients


def batching_on_and_off(args: argparse.Namespace, results: dict[str, Any]) -> list[dict[str, Any]]:
    """The endpoint matrix on a server that batches (32), then classify and 16 streams on one that does not
    (1): the matrix's rows; they, the two comparisons and the batching server's peak RSS go into `results`."""
    n = args.max_new_tokens
    print("batching on (SERVE_MAX_BATCH_SIZE=32)", flush=True)
    settings = {"quantization": args.quantization, "device": args.device}
    with Server(args.artifacts, args.threads, max_batch_size=32, **settings) as server:
        cells = run_matrix(server, endpoint_clients(args), args.scale, args.concurrency)
        streams_on = asyncio.run(drive(server.url, "generate", generate(n), 16, max(32, int(48 * args.scale))))
        results["server_peak_rss_mb"] = server.peak_rss_mb()
    print("batching off (SERVE_MAX_BATCH_SIZE=1)", flush=True)
    with Server(args.artifacts, args.threads, max_batch_size=1, **settings) as server:
        classify_off = asyncio.run(drive(server.url, "classify", classify, 32, max(64, int(128 * args.scale))))
        streams_off = asyncio.run(drive(server.url, "generate", generate(n), 16, max(32, int(48 * args.scale))))
    classify_on = next(c for c in cells if c.endpoint == "classify" and c.concurrency == 32)
    rows = [c.summary() for c in cells]
    results["endpoints"] = rows
    results["dynamic_batching"] = {
        "classify_c32_on_requests_per_s": classify_on.summary()["requests_per_s"],
        "classify_c32_off_requests_per_s": classify_off.summary()["requests_per_s"],
        "speedup": round(
            classify_on.requests / classify_on.seconds / (classify_off.requests / classify_off.seconds), 2
        ),
    }
    results["continuous_batching"] = {
        "streams": 16,
        "on_tokens_per_s": streams_on.summary()["tokens_per_s"],
        "one_at_a_time_tokens_per_s": streams_off.summary()["tokens_per_s"],
        "on_ttft_p50_ms": streams_on.summary()["ttft_p50_ms"],
        "one_at_a_time_ttft_p50_ms": streams_off.summary()["ttft_p50_ms"],
        "speedup": round((streams_on.tokens / streams_on.seconds) / (streams_off.tokens / streams_off.seconds), 2),
    }
    return rows


def comparison_table(results: dict[str, Any]) -> str:
    """Batching on and off, and the KV cache against recomputing, as a Markdown table."""
    db, cb = results["dynamic_batching"], results["continuous_batching"]
    lines = [
        "| comparison | on | off | speedup |\n|---|---|---|---|",
        f"| dynamic batching, classify req/s at c=32 | {db['classify_c32_on_requests_per_s']} | "
        f"{db['classify_c32_off_requests_per_s']} | {db['speedup']}x |",
        f"| continuous batching, tokens/s at 16 streams | {cb['on_tokens_per_s']} | "
        f"{cb['one_at_a_time_tokens_per_s']} | {cb['speedup']}x |",
    ]
    lines += [
        f"| KV cache vs recompute, tokens/s (prompt {kv['prompt_tokens']}, {kv['new_tokens']} new) | "
        f"{kv['kv_cache_tokens_per_s']} | {kv['recompute_tokens_per_s']} | {kv['speedup']}x |"
        for kv in results["kv_cache"]
    ]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    n = args.max_new_tokens
    results: dict[str, Any] = {
        "artifacts": str(args.artifacts),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "threads": args.threads,
        "max_new_tokens": n,
        "quantization": args.quantization,
        "device": args.device,
    }
    rows = batching_on_and_off(args, results)
    print("KV cache vs recompute", flush=True)
    context = load_artifact(args.artifacts / "generator").max_positions
    results["kv_cache"] = [
        kv_cache_vs_recompute(args.artifacts, args.threads, prompt_len=p, new_tokens=n)
        for p in (16, 128)
        if p + n < context
    ]

    print()
    print(table(rows))
    print()
    print(comparison_table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nserver peak RSS (VmHWM) after the matrix: {results['server_peak_rss_mb']} MB")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
