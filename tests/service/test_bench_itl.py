"""benchmarks/itl.py end to end on the tiny generator: both chunk settings measured, a table and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_itl_measures_streams_beside_long_prompts(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "itl.json"
    command = [
        sys.executable, "-m", "benchmarks.itl", "--artifacts", str(tiny_artifacts), "--chunks", "0,4",
        "--rounds", "1", "--threads", "1", "--streams", "2", "--requests", "4", "--prompt-tokens", "6",
        "--new-tokens", "5", "--long-tokens", "20", "--out", str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"0", "4"}
    for row in summary.values():
        assert row["tok_s"] > 0 and 0 <= row["p50"] <= row["p99"] <= row["p999"]
        assert row["long_prompts"] >= 1  # the long-prompt client ran beside the streams
    assert "| SERVE_PREFILL_CHUNK_TOKENS |" in done.stdout
