"""benchmarks/memory_bursts.py end to end on the tiny artifacts: RSS around bursts per route, and the arena's
runs in process; a table and JSON each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory_bursts", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_bench_memory_bursts_reads_rss_around_each_routes_burst(
    tiny_artifacts_with_encoders: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bursts.json"
    done = run("--artifacts", str(tiny_artifacts_with_encoders), "--concurrency", "4", "--rounds", "2",
               "--settle-s", "0.5", "--max-new-tokens", "4", "--setting", "SERVE_INTRA_OP_THREADS=1", "--out", str(out),
               "--text", "a short review")
    record = json.loads(out.read_text())
    routes = {row["route"] for row in record["bursts"]}
    assert {"embeddings", "embed", "classify", "generate", "tokenize"} <= routes  # the tiny set serves them all
    for row in record["bursts"]:
        assert sum(row["statuses"].values()) == 4 and row["rss_peak_mb"] >= row["rss_before_mb"] > 0
        assert row["kept_mb"] == row["rss_after_mb"] - record["rss_start_mb"]
    assert record["kept_mb_max"] == max(row["kept_mb"] for row in record["bursts"])
    assert "| round | route |" in done.stdout and "SERVE_INTRA_OP_THREADS=1" in record["command"]


def test_bench_memory_runs_compares_the_arena_in_process(tiny_artifacts_with_encoders: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    artifacts = str(tiny_artifacts_with_encoders)
    done = run("runs", "--artifacts", artifacts, "--threads", "1", "--blocks", "2", "--out", str(out))
    rows = json.loads(out.read_text())["runs"]
    assert {row["case"].split()[0] for row in rows} == {"embedder", "classifier", "generator"}
    assert all(row["arena_ms"] > 0 and row["no_arena_ms"] > 0 and row["no_arena_faults"] >= 0 for row in rows)
    assert "geometric mean" in done.stdout
