"""The server's own ceiling: our service on tiny random artifacts, where the model costs almost nothing, against
the bare-uvicorn floor (benchmarks/http_floor.py: the same answers at once, no framework, no model), driven
by the same client in the same run. What is left between them is the cost of our request path, which is
what limits a server whose model steps take a millisecond on a GPU.

    python -m benchmarks.server_ceiling [--rounds 3] [--threads 2] [--scale 1] [--out bench_results/server_ceiling.json]

Rows: classify one request at a time and with 32 concurrent clients (requests/s), and 16 concurrent
streams of generated tokens (tokens/s). Each row gives ours, the floor, ours / floor, and each server's CPU
per request or per token: its process CPU time over the cell (the untimed warm-up requests counted too)
divided by what it answered. Rates are the median over the rounds; ours and the floor alternate within a
round. Prints a Markdown table and writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.http_floor import FloorServer
from benchmarks.serving import (
    Client,
    Server,
    classify,
    client_cpu_seconds,
    drive,
    free_port,
    generate,
    machine_cpu_seconds,
    process_cpu_seconds,
)
from model.export.tiny import export_tiny_artifacts

STREAM_TOKENS = 64


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
    cpu, machine, client = process_cpu_seconds(pid), machine_cpu_seconds(), client_cpu_seconds()
    cell = asyncio.run(drive(url, row.name, row.client, row.concurrency, requests))
    if cell.errors:
        raise RuntimeError(f"{row.name}: {cell.errors} of {requests} requests failed")
    served = cell.tokens if row.unit == "tokens" else requests
    answered = served + row.concurrency * row.per_request  # drive's warm-up requests ran too
    server_cpu = process_cpu_seconds(pid) - cpu
    others = machine_cpu_seconds() - machine - server_cpu - (client_cpu_seconds() - client)
    return {"rate": served / cell.seconds, "cpu_us": 1e6 * server_cpu / answered,
            "other_cores": max(0.0, others) / cell.seconds}


def run(rounds: int, threads: int, artifacts: Path, scale: float) -> dict[str, Any]:
    cells: dict[str, dict[str, list[dict[str, float]]]] = {row.name: {"ours": [], "floor": []} for row in ROWS}
    with Server(artifacts, threads, models="classifier,generator") as ours, FloorServer(free_port()) as floor:
        servers: dict[str, tuple[str, Callable[[], int]]] = {
            "ours": (ours.url, lambda: ours.proc.pid), "floor": (floor.url, lambda: floor.proc.pid)}
        for r in range(rounds):
            for row in ROWS:
                for side in ("ours", "floor") if r % 2 == 0 else ("floor", "ours"):
                    url, pid = servers[side]
                    cells[row.name][side].append(measure(url, pid(), row, scale))
                    print(f"round {r + 1} {row.name} {side}: {cells[row.name][side][-1]}", flush=True)
    return {name: summarize(sides) for name, sides in cells.items()}


def summarize(sides: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    def median(side: str, key: str) -> float:
        return statistics.median(c[key] for c in sides[side])

    out = {f"{side}_{key}": round(median(side, key), 2) for side in sides for key in ("rate", "cpu_us")}
    out["ours_per_floor"] = round(median("ours", "rate") / median("floor", "rate"), 3)
    out["other_cores"] = round(max(c["other_cores"] for cells in sides.values() for c in cells), 2)
    return out


def table(summary: dict[str, Any]) -> str:
    lines = ["| row | ours /s | floor /s | ours / floor | server CPU per unit: ours | floor | other cores |",
             "|---|---|---|---|---|---|---|"]
    for row in ROWS:
        s = summary[row.name]
        unit = "request" if row.unit == "requests" else "token"
        lines.append(f"| {row.name} | {s['ours_rate']:.0f} | {s['floor_rate']:.0f} | {s['ours_per_floor']:.2f} | "
                     f"{s['ours_cpu_us']:.0f} us/{unit} | {s['floor_cpu_us']:.0f} us/{unit} | {s['other_cores']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="the server's intra-op threads")
    parser.add_argument("--scale", type=float, default=1.0, help="requests per cell times this (smoke runs: 0.05)")
    parser.add_argument("--out", type=Path, default=Path("bench_results/server_ceiling.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp)
        export_tiny_artifacts(artifacts, ("classifier", "generator"))
        summary = run(args.rounds, args.threads, artifacts, args.scale)
    print(table(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": "python -m benchmarks.server_ceiling " + " ".join(
        f"--{k} {v}" for k, v in (("rounds", args.rounds), ("threads", args.threads), ("scale", args.scale))),
        "machine": platform.processor() or platform.machine(), "rows": summary}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
