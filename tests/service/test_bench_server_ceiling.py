"""benchmarks/server_ceiling.py end to end at a small scale: our server on tiny artifacts and the no-work
floor server, every row measured on both, the table printed and the JSON written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.server_ceiling import ROWS

REPO = Path(__file__).resolve().parents[2]


def test_server_ceiling_measures_ours_and_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    command = [sys.executable, "-m", "benchmarks.server_ceiling", "--rounds", "1", "--scale", "0.02",
               "--threads", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    record = json.loads(out.read_text())
    rows = record["rows"]
    assert set(rows) == {row.name for row in ROWS}
    for name, row in rows.items():
        assert row["ours_rate"] > 0 and row["floor_rate"] > 0, (name, row)
        assert row["ours_per_floor"] > 0, (name, row)
        assert 0 <= row["floor_cpu_us"] < row["ours_cpu_us"], (name, row)  # the floor does no work (10 ms ticks)
        assert 0 <= row["ours_loop_cpu_us"] <= row["ours_cpu_us"], (name, row)  # the event loop is one thread of it
    streams = record["16 streams beside 32 classify clients"]
    for suffix in ("_alone", ""):
        assert streams[f"tokens_per_s{suffix}"] > 0, streams
        assert 0 < streams[f"tpot_p50_ms{suffix}"] <= streams[f"gap_p99_ms{suffix}"] * 64, streams
    assert "| classify, one at a time |" in done.stdout  # the tables
    assert "| beside 32 classify clients |" in done.stdout
