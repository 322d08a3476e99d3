"""benchmarks/server_ceiling.py end to end at a small scale: our server on tiny artifacts and the no-work
floor server, every row measured on both, the table printed and the JSON written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.server_ceiling import ROWS, STREAM_TOKENS

REPO = Path(__file__).resolve().parents[2]


def test_server_ceiling_measures_ours_and_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    # CPU time is read in 10 ms clock ticks per thread: each cell must outlast several (150 lone requests).
    command = [sys.executable, "-m", "benchmarks.server_ceiling", "--rounds", "1", "--scale", "0.1",
               "--threads", "1", "--api-processes", "1,2", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    record = json.loads(out.read_text())
    rows = record["rows"]
    assert set(rows) == {row.name for row in ROWS}
    sides = ("ours", "ours, 2 front ends")
    for name, row in rows.items():
        floor = row["floor"]
        assert floor["rate"] > 0 and floor["per_floor"] == 1, (name, row)
        for side in sides:
            ours = row[side]
            assert ours["rate"] > 0 and ours["per_floor"] > 0 and ours["per_one_process"] > 0, (name, side, row)
            assert 0 <= floor["cpu_us"] < ours["cpu_us"], (name, side, row)  # the floor does no work (10 ms ticks)
            assert 0 <= ours["loop_cpu_us"] <= ours["cpu_us"], (name, side, row)  # the event loops are some threads
            # the engine process's share; with front ends, 30 classify requests cost it under one 10 ms tick
            assert 0 <= ours["engine_cpu_us"] <= ours["cpu_us"], (name, side, row)
        assert row["ours"]["per_one_process"] == 1, row
    decoding = rows[f"generate, 16 streams of {STREAM_TOKENS} tokens"]
    for side in sides:
        assert decoding[side]["engine_cpu_us"] > 0, decoding  # the engine process decodes every token
    for side in sides:
        streams = record["16 streams beside 32 classify clients"][side]
        for suffix in ("_alone", ""):
            assert streams[f"tokens_per_s{suffix}"] > 0, streams
            assert 0 < streams[f"tpot_p50_ms{suffix}"] <= streams[f"gap_p99_ms{suffix}"] * 64, streams
    assert "| classify, one at a time | ours, 2 front ends |" in done.stdout  # the tables
    assert "| beside 32 classify clients | ours, 2 front ends |" in done.stdout
