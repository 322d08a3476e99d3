"""benchmarks/encoder_rewrites.py end to end at a small scale: the three graphs of an encoder, their logits agreeing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_encoder_rewrites_compares_the_three_graphs(tiny_artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "encoder_rewrites.json"
    command = [sys.executable, "-m", "benchmarks.encoder_rewrites", "--artifacts", str(tiny_artifacts), "--models",
               "classifier", "--rows", "1,3", "--tokens", "5", "--rounds", "1", "--threads", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [(r["rows"], r["graph"]) for r in results] == [
        (rows, graph) for rows in (1, 3) for graph in ("exported", "served", "ort transformers")
    ]
    assert all(r["us_per_run"] > 0 and r["max_logit_diff"] < 1e-4 for r in results), results
    served = next(r for r in results if r["graph"] == "served")
    exported = next(r for r in results if r["graph"] == "exported")
    assert served["nodes_after_ort"] < exported["nodes_after_ort"]  # the attention was rewritten
    assert not out.with_suffix(".scratch.onnx").exists()
