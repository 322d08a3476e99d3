"""Capacity model for scaling out: what one replica serves at a p99 latency target, and how many replicas
(and which autoscaler targets) a given load needs.

    python -m benchmarks.capacity bench_results/replica-fp32/bench.json bench_results/replica-int8/bench.json \\
        [--p99-ms classify=100,translate=1000,generate=1000,completions=1000] [--headroom 0.7] \\
        [--load classify=300,translate=20,generate=20,completions=20] [--out bench_results/capacity.json]

Inputs are `benchmarks/serving.py` results of one replica (run with the replica's CPU count as --threads).
For each endpoint the capacity is the best measured cell whose p99 meets the target (no interpolation,
no error). For a load mix (requests/s per endpoint), each endpoint uses load / capacity of a replica;
replicas = ceil(sum / headroom), at least 2 (the PodDisruptionBudget keeps one serving). The autoscaler
targets are those of the load mix at `headroom` of capacity: CPU utilisation (of the CPU request) and
requests waiting per pod (serve_queue_depth). Prints Markdown tables and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENDPOINTS = ("classify", "translate", "generate", "completions")
DEFAULT_P99_MS = {"classify": 100.0, "translate": 1000.0, "generate": 1000.0, "completions": 1000.0}
# A reference mix (requests/s) for docs/deployment.md's example and the manifests' autoscaler targets.
DEFAULT_LOAD = {"classify": 300.0, "translate": 20.0, "generate": 20.0, "completions": 20.0}
MIN_REPLICAS = 2


def per_endpoint(text: str) -> dict[str, float]:
    values = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in ENDPOINTS:
            raise argparse.ArgumentTypeError(f"unknown endpoint {name!r}; choose from {', '.join(ENDPOINTS)}")
        values[name] = float(value)
    return values


def variant_name(bench: dict[str, Any]) -> str:
    name = "int8" if bench.get("quantization") == "int8" else "fp32"
    return f"{name}-cuda" if bench.get("device") == "cuda" else name


def capacity(bench: dict[str, Any], p99_ms: dict[str, float]) -> dict[str, dict[str, Any] | None]:
    """The highest-throughput measured cell per endpoint that meets its p99 target (None: none does)."""
    result: dict[str, dict[str, Any] | None] = {}
    for endpoint in ENDPOINTS:
        cells = [
            c
            for c in bench["endpoints"]
            if c["endpoint"] == endpoint and c["errors"] == 0 and c["p99_ms"] <= p99_ms[endpoint]
        ]
        best = max(cells, key=lambda c: c["requests_per_s"], default=None)
        result[endpoint] = None if best is None else {
            "p99_target_ms": p99_ms[endpoint],
            **{k: best[k] for k in ("concurrency", "requests_per_s", "tokens_per_s", "p99_ms")},
            "server_cores": best.get("server_cores"),
            "queue_depth": best.get("queue_depth"),
            "other_cores": best.get("other_cores"),
        }
    return result


def plan(
    caps: dict[str, dict[str, Any] | None], load: dict[str, float], headroom: float, cpu_request: float
) -> dict[str, Any]:
    """Replicas for `load`, and the autoscaler targets that keep each replica at `headroom` of capacity."""
    missing = [e for e, rate in load.items() if rate > 0 and caps[e] is None]
    if missing:
        raise ValueError(f"no measured cell meets the p99 target for {missing}: no capacity to plan with")
    measured = {e: cap for e, cap in caps.items() if cap is not None}
    shares = {e: rate / measured[e]["requests_per_s"] for e, rate in load.items() if rate > 0}
    busy = sum(shares.values())  # replicas' worth of work at 100 % of capacity
    weight = {e: s / busy for e, s in shares.items()}
    # Per replica at capacity, the work mix averages these (weighted by the time each endpoint takes).
    cores = sum(weight[e] * measured[e]["server_cores"] for e in weight)
    queue = sum(weight[e] * (measured[e]["queue_depth"] or 0.0) for e in weight)
    return {
        "load_requests_per_s": load,
        "replica_share": {e: round(s, 3) for e, s in shares.items()},
        "replicas_at_full_capacity": round(busy, 2),
        "replicas": max(MIN_REPLICAS, math.ceil(busy / headroom)),
        "headroom": headroom,
        "cpu_request_cores": cpu_request,
        "cores_per_replica_at_capacity": round(cores, 2),
        "hpa_cpu_utilization_percent": max(10, round(100 * headroom * cores / cpu_request)),
        "queue_depth_per_replica_at_capacity": round(queue, 2),
        "hpa_queue_depth_per_pod": max(1, math.ceil(queue)),
    }


def capacity_table(variants: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| variant | endpoint | p99 target ms | concurrency | requests/s | tokens/s | p99 ms | cores used | queue"
        " | other cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, variant in variants.items():
        for endpoint, cap in variant["capacity"].items():
            if cap is None:
                lines.append(f"| {name} | {endpoint} | | target not met at any measured concurrency | | | | | | |")
                continue
            cells = [cap[k] for k in ("p99_target_ms", "concurrency", "requests_per_s", "tokens_per_s", "p99_ms")]
            cells += [cap["server_cores"], cap["queue_depth"], cap["other_cores"]]
            lines.append(f"| {name} | {endpoint} | " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", type=Path, nargs="+", help="bench.json files of benchmarks/serving.py (one replica)")
    parser.add_argument("--p99-ms", type=per_endpoint, default={}, help="p99 targets, e.g. classify=100")
    parser.add_argument("--load", type=per_endpoint, default=DEFAULT_LOAD, help="requests/s, e.g. generate=30")
    parser.add_argument("--headroom", type=float, default=0.7, help="fraction of capacity to run at (0-1]")
    parser.add_argument("--cpu-request", type=float, default=2.0, help="CPU request of a replica, in cores")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "capacity.json")
    args = parser.parse_args()
    if not 0 < args.headroom <= 1:
        parser.error("--headroom must be in (0, 1]")
    p99 = DEFAULT_P99_MS | args.p99_ms
    variants: dict[str, dict[str, Any]] = {}
    for path in args.bench:
        bench = json.loads(path.read_text())
        if bench["threads"] != args.cpu_request:
            parser.error(f"{path} ran with --threads {bench['threads']}, not the replica's {args.cpu_request} cores")
        caps = capacity(bench, p99)
        variants[variant_name(bench)] = {
            "source": str(path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path),
            "server_peak_rss_mb": bench["server_peak_rss_mb"],
            "capacity": caps,
            "plan": plan(caps, args.load, args.headroom, args.cpu_request),
        }
    print(capacity_table(variants))
    print()
    print("| variant | load (req/s) | replicas | HPA CPU target % | HPA queue depth per pod | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for name, variant in variants.items():
        p = variant["plan"]
        load = ", ".join(f"{e} {r:g}" for e, r in p["load_requests_per_s"].items())
        print(
            f"| {name} | {load} | {p['replicas']} | {p['hpa_cpu_utilization_percent']} | "
            f"{p['hpa_queue_depth_per_pod']} | {variant['server_peak_rss_mb']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"p99_target_ms": p99, "variants": variants}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
