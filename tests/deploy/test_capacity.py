"""benchmarks/capacity.py: capacity at a p99 target, replicas and autoscaler targets for a load mix."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.capacity import capacity, plan


def cell(
    endpoint: str, concurrency: int, rps: float, p99: float, cores: float, queue: float, errors: int = 0
) -> dict[str, Any]:
    return {
        "endpoint": endpoint, "concurrency": concurrency, "requests_per_s": rps, "tokens_per_s": rps * 10,
        "p99_ms": p99, "errors": errors, "server_cores": cores, "queue_depth": queue, "other_cores": 0.0,
    }


BENCH = {
    "endpoints": [
        cell("classify", 1, 100, 20, 0.5, 0.0),
        cell("classify", 8, 400, 60, 1.5, 2.0),
        cell("classify", 32, 500, 150, 1.9, 9.0),  # the fastest, but past a 100 ms p99
        cell("translate", 1, 5, 300, 1.0, 0.0),
        cell("translate", 8, 12, 900, 1.6, 1.0, errors=1),  # an error disqualifies the cell
        cell("generate", 1, 4, 1500, 1.0, 0.0),  # never meets 1000 ms
        cell("completions", 4, 20, 800, 1.0, 1.0),
    ]
}
P99 = {"classify": 100.0, "translate": 1000.0, "generate": 1000.0, "completions": 1000.0}


def test_capacity_is_the_best_cell_that_meets_the_target() -> None:
    caps = capacity(BENCH, P99)
    classify, translate, completions = caps["classify"], caps["translate"], caps["completions"]
    assert classify is not None and classify["concurrency"] == 8 and classify["requests_per_s"] == 400
    assert translate is not None and translate["concurrency"] == 1
    assert caps["generate"] is None
    assert completions is not None and completions["requests_per_s"] == 20


def test_plan_adds_up_replica_shares_and_derives_the_targets() -> None:
    caps = capacity(BENCH, P99)
    # 200 classify = 0.5 replica, 5 translate = 1 replica, 10 completions = 0.5 replica: 2 replicas of work.
    p = plan(caps, {"classify": 200, "translate": 5, "completions": 10}, headroom=0.5, cpu_request=2.0)
    assert p["replicas_at_full_capacity"] == 2.0 and p["replicas"] == 4
    # Time-weighted: 1/4 at 1.5 cores, 1/2 at 1.0, 1/4 at 1.0 -> 1.125 cores; half of that of 2 cores.
    assert p["cores_per_replica_at_capacity"] == pytest.approx(1.125, abs=0.006)
    assert p["hpa_cpu_utilization_percent"] == 28
    # Queue: 1/4 x 2 + 1/2 x 0 + 1/4 x 1 = 0.75 -> at least one waiting request per pod.
    assert p["queue_depth_per_replica_at_capacity"] == 0.75 and p["hpa_queue_depth_per_pod"] == 1


def test_plan_keeps_two_replicas_and_refuses_an_endpoint_without_capacity() -> None:
    caps = capacity(BENCH, P99)
    assert plan(caps, {"classify": 1}, headroom=0.7, cpu_request=2.0)["replicas"] == 2
    with pytest.raises(ValueError, match="generate"):
        plan(caps, {"generate": 1}, headroom=0.7, cpu_request=2.0)
