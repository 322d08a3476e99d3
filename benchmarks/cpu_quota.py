"""ONNX Runtime's threads spinning between runs, or parked, in a container under a CPU limit: the CPU image
run with `docker run --cpus`, once per SERVE_SPIN_BETWEEN_RUNS value (the containers alternating within each
round), serving the committed classifier to closed-loop clients on this machine.

    python -m benchmarks.cpu_quota [--cpus 1.5,2] [--concurrency 1,32] [--rounds 2] [--requests 1500]
                                   [--image transformer-serving:cpu] [--out bench_results/cpu_quota.json]

Needs a Docker engine and the image (`make docker-build`; here `../shared/tools/docker-sandbox start`, then
`docker build --network host -t transformer-serving:cpu .`). A spinning thread's wait counts against the
container's quota (a Kubernetes CPU limit is one) like work does: once the quota of a period is spent, every
thread of the container waits for the next period. Per cell: requests/s (median over the rounds), p50 and p99
latency, and the periods the container was throttled in (its cgroup's cpu.stat). Prints a Markdown table and
writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.http_load import classify, drive
from benchmarks.record import write_record

REPO = Path(__file__).resolve().parent.parent
PORT = 8899
# cgroup v2, then v1: the throttled periods and time of the container's CPU controller.
CPU_STAT = "cat /sys/fs/cgroup/cpu.stat 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.stat"


def throttled(stat: str) -> tuple[int, float]:
    """(periods throttled, seconds throttled) from a cgroup's cpu.stat (v2: throttled_usec; v1: throttled_time, ns)."""
    fields = dict(line.split() for line in stat.splitlines() if len(line.split()) == 2)
    if "throttled_usec" in fields:
        return int(fields["nr_throttled"]), int(fields["throttled_usec"]) / 1e6
    return int(fields["nr_throttled"]), int(fields["throttled_time"]) / 1e9


class Container:
    """The image serving the classifier on 127.0.0.1:PORT with host networking, under --cpus."""

    def __init__(self, image: str, cpus: str, spin: bool, threads: int) -> None:
        self.name = f"cpu-quota-{cpus}-{str(spin).lower()}"
        settings = {"SERVE_PORT": PORT, "SERVE_MODELS": "classifier", "SERVE_INTRA_OP_THREADS": threads,
                    "SERVE_SPIN_BETWEEN_RUNS": str(spin).lower(), "SERVE_LOG_LEVEL": "warning",
                    "SERVE_MAX_QUEUE_SIZE": 1024}
        env = [part for key, value in settings.items() for part in ("-e", f"{key}={value}")]
        self.command = ["docker", "run", "-d", "--rm", "--name", self.name, "--network", "host", f"--cpus={cpus}",
                        *env, image]

    def __enter__(self) -> Container:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)
        subprocess.run(self.command, check=True, capture_output=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.__exit__()
        raise SystemExit(f"{self.name} was not ready in 180 s")

    def __exit__(self, *_: object) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)

    def throttled(self) -> tuple[int, float]:
        done = subprocess.run(["docker", "exec", self.name, "sh", "-c", CPU_STAT], capture_output=True, text=True)
        return throttled(done.stdout)


def measure(container: Container, concurrency: int, requests: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{PORT}"
    asyncio.run(drive(url, "warm-up", classify, concurrency, max(concurrency, 100)))
    periods, seconds = container.throttled()
    cell = asyncio.run(drive(url, "classify", classify, concurrency, requests))
    periods_after, seconds_after = container.throttled()
    assert not cell.errors, f"{cell.errors} errors"
    summary = cell.summary()
    return {"requests_per_s": summary["requests_per_s"], "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"],
            "throttled_periods": periods_after - periods, "throttled_s": round(seconds_after - seconds, 2)}


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table: a row per CPU limit, clients and setting; parked against spinning per cell."""
    spinning = {(r["cpus"], r["concurrency"]): r["requests_per_s"] for r in rows if r["spin_between_runs"]}
    lines = ["| --cpus | clients | SERVE_SPIN_BETWEEN_RUNS | requests/s | / spinning | p50 ms | p99 ms | "
             "throttled periods | throttled s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = spinning.get((r["cpus"], r["concurrency"]))
        ratio = f"{r['requests_per_s'] / base:.2f}" if base else "-"
        lines.append(f"| {r['cpus']} | {r['concurrency']} | {str(r['spin_between_runs']).lower()} | "
                     f"{r['requests_per_s']:,.0f} | {ratio} | {r['p50_ms']} | {r['p99_ms']} | "
                     f"{r['throttled_periods']} | {r['throttled_s']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", default="1.5,2", help="docker run --cpus values, comma-separated")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1500, help="per cell")
    parser.add_argument("--threads", type=int, default=2, help="SERVE_INTRA_OP_THREADS")
    parser.add_argument("--image", default="transformer-serving:cpu")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "cpu_quota.json")
    args = parser.parse_args()
    limits = args.cpus.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    cells: dict[tuple[str, int, bool], list[dict[str, Any]]] = {}
    for cpus in limits:
        for round_ in range(args.rounds):
            for spin in (True, False) if round_ % 2 == 0 else (False, True):
                with Container(args.image, cpus, spin, args.threads) as container:
                    for concurrency in levels:
                        cells.setdefault((cpus, concurrency, spin), []).append(
                            measure(container, concurrency, args.requests))
                        print(f"--cpus {cpus}, round {round_ + 1}, spin {spin}, {concurrency} clients: "
                              f"{cells[cpus, concurrency, spin][-1]}", flush=True)
    rows = []
    for (cpus, concurrency, spin), runs in cells.items():
        rows.append({"cpus": cpus, "concurrency": concurrency, "spin_between_runs": spin,
                     **{k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]},
                     "rounds_requests_per_s": [r["requests_per_s"] for r in runs]})
    rows.sort(key=lambda r: (float(r["cpus"]), r["concurrency"], not r["spin_between_runs"]))
    print("\n" + "\n".join(table(rows)))
    options = (("cpus", args.cpus), ("concurrency", args.concurrency), ("rounds", args.rounds),
               ("requests", args.requests), ("threads", args.threads), ("image", args.image))
    write_record("cpu_quota", options, args.out, rows=rows)


if __name__ == "__main__":
    main()
