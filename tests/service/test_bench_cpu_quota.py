"""benchmarks/cpu_quota.py without Docker: the cgroup's throttling counters (v1 and v2) and the table."""

from __future__ import annotations

from benchmarks.cpu_quota import Container, table, throttled


def test_throttling_reads_both_cgroup_versions() -> None:
    v2 = "usage_usec 9000\nuser_usec 7000\nsystem_usec 2000\nnr_periods 40\nnr_throttled 12\nthrottled_usec 450000\n"
    v1 = "nr_periods 40\nnr_throttled 12\nthrottled_time 450000000\nnr_bursts 0\nburst_time 0\n"
    assert throttled(v2) == (12, 0.45)
    assert throttled(v1) == (12, 0.45)


def test_the_container_runs_the_image_under_the_limit_with_the_setting() -> None:
    command = Container("transformer-serving:cpu", "1.5", spin=False, threads=2).command
    assert command[-1] == "transformer-serving:cpu" and "--cpus=1.5" in command and "--network" in command
    assert "SERVE_SPIN_BETWEEN_RUNS=false" in command and "SERVE_MODELS=classifier" in command


def test_the_table_compares_parked_with_spinning_in_each_cell() -> None:
    cell = {"p50_ms": 1.0, "p99_ms": 2.0, "throttled_periods": 0, "throttled_s": 0.0}
    rows = [
        {"cpus": "1.5", "concurrency": 1, "spin_between_runs": True, "requests_per_s": 500.0, **cell},
        {"cpus": "1.5", "concurrency": 1, "spin_between_runs": False, "requests_per_s": 750.0, **cell},
    ]
    lines = table(rows)
    assert lines[0].startswith("| --cpus | clients | SERVE_SPIN_BETWEEN_RUNS |")
    assert lines[2].split(" | ")[4] == "1.00" and lines[3].split(" | ")[4] == "1.50"
