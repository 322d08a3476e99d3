"""benchmarks/batch_wait.py end to end at a small scale: one server per wait, a row per clients and wait."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_batch_wait_measures_each_wait_at_each_concurrency(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "batch_wait.json"
    command = [sys.executable, "-m", "benchmarks.batch_wait", "--artifacts", str(tiny_artifacts), "--waits", "0,20",
               "--concurrency", "1,4", "--rounds", "1", "--requests", "40", "--threads", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["concurrency"], r["max_wait_ms"]) for r in rows] == [(1, 0.0), (1, 20.0), (4, 0.0), (4, 20.0)]
    assert all(r["requests_per_s"] > 0 and r["rows_per_run"] >= 1 for r in rows), rows
    # A lone client never waits; four clients wait for company at 20 ms, and each answer waits with them.
    by = {(r["concurrency"], r["max_wait_ms"]): r for r in rows}
    assert by[4, 20.0]["p50_ms"] > by[4, 0.0]["p50_ms"], rows
    assert "| clients | SERVE_MAX_WAIT_MS |" in done.stdout
