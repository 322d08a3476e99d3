"""scripts/bench_anchor.py end to end on the tiny artifacts: our server, CTranslate2 and HF eager, every row.

ctranslate2 comes with the dev extra (through the bench extra), so this runs in CI rather than being skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts.bench_anchor import ROWS

REPO = Path(__file__).resolve().parents[2]


def test_anchor_runs_every_engine_on_tiny_models(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "anchor.json"
    command = [
        sys.executable, "-m", "scripts.bench_anchor", "--artifacts", str(tiny_artifacts), "--ours", "as-is",
        "--work", str(tmp_path / "work"), "--rounds", "2", "--scale", "0.01", "--threads", "1",
        "--prompt-tokens", "6", "--new-tokens", "5", "--target-tokens", "4", "--out", str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())

    rows = result["rows"]
    assert set(rows) == {*ROWS, "inter_token_latency_c16"}
    for key in ROWS:
        row = rows[key]
        assert row["ours"] > 0 and row["ct2"] > 0 and row["ours_per_ct2"] > 0, (key, row)
        if key == "generator_int8_c16":  # no int8 HF eager row, as in the table
            assert row["hf"] is None and row["ours_per_hf"] is None
        else:
            assert row["hf"] > 0 and row["ours_per_hf"] > 0, (key, row)
        assert row["equal_lengths"], (key, row["output_tokens"])  # every engine decoded the same lengths
    assert rows["generator_c16"]["output_tokens"]["ours"] == [5]
    assert rows["translator_beam4_c16"]["output_tokens"]["ct2"] == [4]
    itl = rows["inter_token_latency_c16"]
    assert 0 <= itl["p50"] <= itl["p99"]
    assert len(result["rounds"]) == 2 and result["shapes"]["prompt_tokens"] == 6
    # Ratios are taken within each round, then the median: two rounds -> the mean of the two.
    per_round = [r["classifier_c32"]["ours_per_ct2"] for r in result["rounds"]]
    assert abs(rows["classifier_c32"]["ours_per_ct2"] - round(sum(per_round) / 2, 3)) < 1e-3
    assert "| ours / CT2 |" in done.stdout
