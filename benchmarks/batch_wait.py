"""Batching with and without a wait for company (SERVE_MAX_WAIT_MS): the classifier served from --artifacts,
driven by closed-loop clients (each sends its next request when the last is answered, as most programs do)
at several concurrencies, one server per wait, the servers alternating within each round.

    python -m benchmarks.batch_wait [--artifacts artifacts] [--waits 0,5] [--concurrency 1,4,8,16,32,64]
                                    [--rounds 2] [--requests 1500] [--threads 2] [--out bench_results/batch_wait.json]

Per cell: requests/s (median over the rounds), p50 and p99 latency, and the mean rows of the classifier's runs
(from /metrics). With a wait, the requests that arrive at an idle model wait for a full batch, which clients
like these never fill: they are waiting for the answers of the batch before. Prints a Markdown table and
writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any

from benchmarks.http_load import classify, drive
from benchmarks.record import write_record
from benchmarks.server_process import Server, batch_rows

REPO = Path(__file__).resolve().parent.parent



def measure(server: Server, concurrency: int, requests: int) -> dict[str, Any]:
    asyncio.run(drive(server.url, "warm-up", classify, concurrency, max(concurrency, 100)))
    rows_before, runs_before = batch_rows(server.url, "classifier", "prefill")
    cell = asyncio.run(drive(server.url, "classify", classify, concurrency, requests))
    rows_after, runs_after = batch_rows(server.url, "classifier", "prefill")
    assert not cell.errors, f"{cell.errors} errors"
    summary = cell.summary()
    runs = runs_after - runs_before
    return {"requests_per_s": summary["requests_per_s"], "p50_ms": summary["p50_ms"],
            "p99_ms": summary["p99_ms"], "rows_per_run": round((rows_after - rows_before) / runs, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--waits", default="0,5", help="SERVE_MAX_WAIT_MS values, comma-separated")
    parser.add_argument("--concurrency", default="1,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1500, help="per cell")
    parser.add_argument("--threads", type=int, default=2, help="the server's intra-op threads")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "batch_wait.json")
    args = parser.parse_args()
    waits = [float(w) for w in args.waits.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    cells: dict[tuple[float, int], list[dict[str, Any]]] = {(w, c): [] for w in waits for c in levels}
    for round_ in range(args.rounds):
        for wait in waits if round_ % 2 == 0 else waits[::-1]:
            with Server(args.artifacts, args.threads, models="classifier", max_wait_ms=wait,
                        max_queue_size=max(256, max(levels))) as server:
                for concurrency in levels:
                    cells[wait, concurrency].append(measure(server, concurrency, args.requests))
                    print(f"round {round_ + 1}, wait {wait:g} ms, {concurrency} clients: "
                          f"{cells[wait, concurrency][-1]}", flush=True)
    rows = []
    for concurrency in levels:
        for wait in waits:
            runs = cells[wait, concurrency]
            rows.append({"concurrency": concurrency, "max_wait_ms": wait,
                         **{k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]},
                         "rounds_requests_per_s": [r["requests_per_s"] for r in runs]})
    base = {r["concurrency"]: r["requests_per_s"] for r in rows if r["max_wait_ms"] == waits[0]}
    print(f"\n| clients | SERVE_MAX_WAIT_MS | requests/s | / wait {waits[0]:g} | p50 ms | p99 ms | rows per run |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['max_wait_ms']:g} | {r['requests_per_s']:,.0f} | "
              f"{r['requests_per_s'] / base[r['concurrency']]:.2f} | {r['p50_ms']} | {r['p99_ms']} | "
              f"{r['rows_per_run']} |")
    shown = args.artifacts.resolve()
    shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
    options = (("artifacts", shown), ("waits", args.waits), ("concurrency", args.concurrency),
               ("rounds", args.rounds), ("requests", args.requests), ("threads", args.threads))
    write_record("batch_wait", options, args.out, rows=rows)


if __name__ == "__main__":
    main()
