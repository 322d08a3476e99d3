"""benchmarks/gpu_check.py's steps end to end on the CPU (--device cpu): the committed artifacts' parity, then a
tiny model of SmolLM2's family built, served by ours and run by CTranslate2 on every row. What would run on a lent
GPU, minus the install and the provider check (tests/service/test_gpu_check.py), so the one run there does not
stop at a slip in its plumbing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_step_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--model", "tiny-llama",
               "--rounds", "1", "--requests-factor", "1", "--scale", "0.05", "--threads", "1",
               "--work", str(tmp_path / "work"), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["status"] == "passed" and record["device"] == "cpu"
    for name in ("generator", "translator"):
        parity = record["parity"][name]
        assert parity["passed"] and parity["greedy_token_agreement"] == 1.0, parity
        assert set(parity["providers"].values()) == {"CPUExecutionProvider"}
    rows = record["rows"]
    assert set(rows["engines"]) == {"ours", "ct2-float32"}, rows["skipped"]
    assert rows["ours_providers"] == {"decoder": "CPUExecutionProvider"}
    for engine in rows["engines"].values():
        assert engine["prefill1000"]["prompt_tokens_per_s"] > 0 and engine["c16"]["tokens_per_s"] > 0
        assert engine["single"]["tokens_per_s"] > 0
    assert "| tiny-llama shape, on cpu (--scale 0.05) | ours | ct2-float32 | ours / ct2-float32 |" in done.stdout
