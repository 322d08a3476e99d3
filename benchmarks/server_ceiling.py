"""The server's own ceiling: our service on tiny random artifacts, where the model costs almost nothing, against
the bare-uvicorn floor (benchmarks/http_floor.py: the same answers at once, no framework, no model), driven
by the same client in the same run. What is left between them is the cost of our request path, which is
what limits a server whose model steps take a millisecond on a GPU.

    python -m benchmarks.server_ceiling [--rounds 3] [--threads 2] [--scale 1] [--api-processes 1,2]
                                        [--out bench_results/server_ceiling.json]

Ours runs once per --api-processes value (SERVE_API_PROCESSES: the HTTP front end in that many processes
beside one engine process), each a server of its own. Rows: classify one request at a time and with 32
concurrent clients (requests/s), and 16 concurrent streams of generated tokens (tokens/s). Each row gives
every server's rate, its ratio to the floor and to ours in one process, and its CPU per request or per
token: the CPU time of its processes over the cell (the untimed warm-up requests counted too) divided by
what it answered; of it, the part spent on the main threads, which run the event loops (the HTTP work,
validation, tokenizing and rendering, and with front ends the engine process's relaying), apart from the
engine's worker and ONNX Runtime threads; and the part of the engine process (with one process, all of it).
Rates are the median over the rounds; the servers alternate within a round.

One more table, ours alone: the 16 streams again, alone and while 32 classify clients run beside them (from a
process of their own). For the streams: tokens/s, the time per output token (a request's first to last token
over its tokens, p50 over the requests), the p99 of the gaps between consecutive token chunks a stream
received, and p99 gap / p50 time per token: how long the worst stalls are against a steady stream. (The p50
of the gaps themselves says little here: on 2 cores the client reads several tokens at once when it gets a
core back, so most gaps are ~0.)
Prints Markdown tables and writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from benchmarks.cpu_time import client_cpu_seconds, cpu_between, machine_cpu_seconds, threads_cpu
from benchmarks.http_floor import FloorServer
from benchmarks.http_load import Client, Connection, back_to_back, classify, drive, generate
from benchmarks.record import write_record
from benchmarks.server_process import Server, free_port
from model.export.tiny import export_tiny_artifacts

STREAM_TOKENS = 64
T = TypeVar("T")
MIXED_STREAMS, MIXED_CLASSIFIERS, MIXED_STREAM_REQUESTS = 16, 32, 160


@dataclass(frozen=True)
class Row:
    name: str
    unit: str  # what the rate counts: requests or tokens
    concurrency: int
    requests: int
    client: Client
    per_request: int  # units one request answers (the warm-up requests count them too)


ROWS = (
    Row("classify, one at a time", "requests", 1, 1500, classify, 1),
    Row("classify, 32 concurrent", "requests", 32, 4000, classify, 1),
    Row(f"generate, 16 streams of {STREAM_TOKENS} tokens", "tokens", 16, 160, generate(STREAM_TOKENS), STREAM_TOKENS),
)


def measure(url: str, pid: int, row: Row, scale: float) -> dict[str, float]:
    """One cell: the rate, the server's CPU per unit answered, and the cores everything else used."""
    requests = max(row.concurrency, round(row.requests * scale))
    before, machine, client = threads_cpu(pid), machine_cpu_seconds(), client_cpu_seconds()
    cell = asyncio.run(drive(url, row.name, row.client, row.concurrency, requests))
    if cell.errors:
        raise RuntimeError(f"{row.name}: {cell.errors} of {requests} requests failed")
    served = cell.tokens if row.unit == "tokens" else requests
    answered = served + row.concurrency * row.per_request  # drive's warm-up requests ran too
    used = cpu_between(before, threads_cpu(pid)).values()
    server_cpu = sum(t.seconds for t in used)
    loop_cpu = sum(t.seconds for t in used if t.main)
    engine_cpu = sum(t.seconds for t in used if t.process == 0)
    others = machine_cpu_seconds() - machine - server_cpu - (client_cpu_seconds() - client)
    return {"rate": served / cell.seconds, "cpu_us": 1e6 * server_cpu / answered,
            "loop_cpu_us": 1e6 * loop_cpu / answered, "engine_cpu_us": 1e6 * engine_cpu / answered,
            "other_cores": max(0.0, others) / cell.seconds}


def classify_load(url: str, ready: Any, stop: Any) -> None:
    """In a process of its own (so the streams' client reads its sockets on time): MIXED_CLASSIFIERS
    clients classify back to back until `stop` is set; `ready` is set once each has been answered."""

    async def load() -> None:
        host, port = url.removeprefix("http://").split(":")
        answered = 0

        async def client() -> None:
            nonlocal answered
            conn = Connection(host, int(port))
            await classify(conn)
            answered += 1
            if answered == MIXED_CLASSIFIERS:
                ready.set()
            while not stop.is_set():
                await classify(conn)
            conn.close()

        await asyncio.gather(*(client() for _ in range(MIXED_CLASSIFIERS)))

    asyncio.run(load())


async def streams(url: str, requests: int) -> tuple[int, list[float], list[float], float]:
    """MIXED_STREAMS clients stream `requests` completions back to back: (tokens, the gaps between the chunks
    of token events each stream received, each request's time per output token, seconds)."""
    stream_client = generate(STREAM_TOKENS)
    gaps: list[float] = []
    per_token: list[float] = []
    tokens = 0

    async def streamed(conn: Connection) -> None:
        nonlocal tokens
        conn.chunk_times = []
        got, _ = await stream_client(conn)  # not `tokens += await ...`: that reads `tokens` before the await
        tokens += got
        gaps.extend(np.diff(conn.chunk_times))
        per_token.append((conn.chunk_times[-1] - conn.chunk_times[0]) / (got - 1))

    started = time.perf_counter()
    await back_to_back(url, MIXED_STREAMS, requests, streamed)
    return tokens, gaps, per_token, time.perf_counter() - started


def streams_beside_classify(url: str, scale: float) -> dict[str, float]:
    """The streams' inter-token gaps and tokens/s without the classify load, then while it runs beside them."""
    requests = max(MIXED_STREAMS, round(MIXED_STREAM_REQUESTS * scale))

    def measure() -> tuple[int, list[float], list[float], float]:
        return asyncio.run(streams(url, requests))

    out: dict[str, float] = {}
    for suffix, (tokens, gaps, per_token, seconds) in (("_alone", measure()), ("", beside_classify_load(url, measure))):
        tpot, p99 = 1000 * float(np.median(per_token)), 1000 * float(np.percentile(gaps, 99))
        out |= {f"tokens_per_s{suffix}": tokens / seconds, f"tpot_p50_ms{suffix}": tpot,
                f"gap_p99_ms{suffix}": p99, f"gap_p99_per_tpot{suffix}": p99 / tpot}
    return out


def beside_classify_load(url: str, measure: Callable[[], T]) -> T:
    """`measure()` while classify_load runs in a child process: started and answered before, stopped after,
    and a child that failed fails the measurement (else the row would be measured without its load)."""
    ready, stop = multiprocessing.Event(), multiprocessing.Event()
    load = multiprocessing.Process(target=classify_load, args=(url, ready, stop), daemon=True)
    load.start()
    try:
        while not ready.wait(timeout=0.1):
            if not load.is_alive():
                raise RuntimeError(f"the classify load exited before it ran (exit code {load.exitcode})")
        result = measure()
        if not load.is_alive():
            raise RuntimeError(f"the classify load stopped during the measurement (exit code {load.exitcode})")
        return result
    finally:
        stop.set()
        load.join(timeout=30)
        if load.is_alive():
            load.terminate()


def side_name(processes: int) -> str:
    """Our server with `processes` HTTP front ends (SERVE_API_PROCESSES)."""
    return "ours" if processes == 1 else f"ours, {processes} front ends"


def run(
    rounds: int, threads: int, artifacts: Path, scale: float, api_processes: list[int]
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    sides = [*(side_name(n) for n in api_processes), "floor"]
    cells: dict[str, dict[str, list[dict[str, float]]]] = {row.name: {side: [] for side in sides} for row in ROWS}
    mixed: dict[str, list[dict[str, float]]] = {side_name(n): [] for n in api_processes}
    with contextlib.ExitStack() as stack:
        models = "classifier,generator"
        ours = {
            side_name(n): stack.enter_context(Server(artifacts, threads, models=models, api_processes=n))
            for n in api_processes
        }
        floor = stack.enter_context(FloorServer(free_port()))
        targets = {side: (server.url, server.proc.pid) for side, server in ours.items()}
        targets["floor"] = (floor.url, floor.proc.pid)
        for r in range(rounds):
            for row in ROWS:
                for side in sides if r % 2 == 0 else reversed(sides):
                    cells[row.name][side].append(measure(*targets[side], row, scale))
                    print(f"round {r + 1} {row.name} {side}: {cells[row.name][side][-1]}", flush=True)
            for side in mixed:
                mixed[side].append(streams_beside_classify(targets[side][0], scale))
                print(f"round {r + 1} streams beside classify, {side}: {mixed[side][-1]}", flush=True)
    medians = {
        side: {key: round(statistics.median(m[key] for m in runs), 2) for key in runs[0]}
        for side, runs in mixed.items()
    }
    return {name: summarize(by_side) for name, by_side in cells.items()}, medians


def summarize(sides: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    def median(side: str, key: str) -> float:
        return statistics.median(c[key] for c in sides[side])

    out: dict[str, Any] = {}
    for side in sides:
        keys = ("rate", "cpu_us", "loop_cpu_us", "engine_cpu_us")
        out[side] = {key: round(median(side, key), 2) for key in keys}
        out[side]["per_floor"] = round(median(side, "rate") / median("floor", "rate"), 3)
        one = median("ours", "rate") if "ours" in sides else None
        out[side]["per_one_process"] = None if one is None else round(median(side, "rate") / one, 3)
    out["other_cores"] = round(max(c["other_cores"] for cells in sides.values() for c in cells), 2)
    return out


def table(summary: dict[str, Any], mixed: dict[str, dict[str, float]]) -> str:
    lines = ["| row | server | /s | / floor | / one process | server CPU per unit | of it, event loops "
             "| of it, engine process |", "|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        unit = "request" if row.unit == "requests" else "token"
        for side, s in summary[row.name].items():
            if side == "other_cores":
                continue
            versus_one = "" if s["per_one_process"] is None else f"{s['per_one_process']:.2f}"
            lines.append(f"| {row.name} | {side} | {s['rate']:.0f} | {s['per_floor']:.2f} | {versus_one} | "
                         f"{s['cpu_us']:.0f} us/{unit} | {s['loop_cpu_us']:.0f} us/{unit} | "
                         f"{s['engine_cpu_us']:.0f} us/{unit} |")
    lines += ["", f"| {MIXED_STREAMS} streams of {STREAM_TOKENS} tokens | server | tokens/s | time per token p50 ms "
              "| inter-token gap p99 ms | gap p99 / time per token |", "|---|---|---|---|---|---|"]
    for side, m in mixed.items():
        for suffix, name in (("_alone", "alone"), ("", f"beside {MIXED_CLASSIFIERS} classify clients")):
            lines.append(f"| {name} | {side} | {m['tokens_per_s' + suffix]:.0f} | {m['tpot_p50_ms' + suffix]} | "
                         f"{m['gap_p99_ms' + suffix]} | {m['gap_p99_per_tpot' + suffix]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="the server's intra-op threads")
    parser.add_argument("--scale", type=float, default=1.0, help="requests per cell times this (smoke runs: 0.05)")
    parser.add_argument("--api-processes", default="1,2",
                        help="comma-separated SERVE_API_PROCESSES values, each a server of its own (1 first)")
    parser.add_argument("--out", type=Path, default=Path("bench_results/server_ceiling.json"))
    args = parser.parse_args()
    api_processes = sorted({int(n) for n in args.api_processes.split(",")})
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp)
        export_tiny_artifacts(artifacts, ("classifier", "generator"))
        summary, mixed = run(args.rounds, args.threads, artifacts, args.scale, api_processes)
    print(table(summary, mixed))
    options = (("rounds", args.rounds), ("threads", args.threads), ("scale", args.scale),
               ("api-processes", args.api_processes))
    write_record("server_ceiling", options, args.out, rows=summary,
                 **{f"{MIXED_STREAMS} streams beside {MIXED_CLASSIFIERS} classify clients": mixed})


if __name__ == "__main__":
    main()
