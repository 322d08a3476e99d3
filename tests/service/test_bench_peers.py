"""benchmarks/peers.py end to end at a tiny scale: tiny models of the real ones' families built, imported and
converted at test time, our server (and its int4 import) and CTranslate2 on every row; a peer whose venv is missing
is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_peers_measures_every_row_of_ours_and_ct2(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    command = [sys.executable, "-m", "benchmarks.peers", "--models", "tiny-llama,tiny-bert",
               "--peers", "ours,ours-int4,ct2,vllm-fp32", "--rounds", "1", "--scale", "0.05", "--threads", "1",
               "--work", str(tmp_path / "work"), "--out", str(out)]
    env = os.environ | {"PEERS_VENV": str(tmp_path / "no-venv")}  # as in CI: no `make peers`
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["command"].startswith("python -m benchmarks.peers --models tiny-llama,tiny-bert")
    decoder = record["models"]["tiny-llama"]
    assert set(decoder["engines"]) == {"ours", "ours-int4", "ct2"}, decoder
    assert "no-venv has no vllm" in decoder["skipped"]["vllm-fp32"]
    rows = ["c16", "single", "prefill256", "prefill1000", "prefill2000", "streams64", "streams1500"]
    for engine in ("ours", "ours-int4", "ct2"):
        measured = decoder["engines"][engine]
        assert list(measured) == rows, measured
        assert measured["c16"]["tokens_per_s"] > 0 and measured["prefill1000"]["prompt_tokens_per_s"] > 0
        streams = measured["streams1500"]
        assert streams["decode_tokens_per_s_per_stream"] > 0 and streams["ttft_s"] > 0, streams
        assert len(streams["rounds"]) == 1
    encoder = record["models"]["tiny-bert"]
    assert set(encoder["engines"]) == {"ours", "ct2"}, encoder
    assert all(encoder["engines"][e][row]["embeddings_per_s"] > 0 for e in ("ours", "ct2") for row in ("emb1", "emb32"))
    assert "| row | ours | ours-int4 | ct2 | ours / ct2 |" in done.stdout
    assert "| 16 concurrent, 64-token prompts, 128 new tokens (tok/s) |" in done.stdout
    assert "skipped vllm-fp32: " in done.stdout
    assert set(decoder["other_cores"]) == {"ours", "ours-int4", "ct2"}
    assert all(v >= 0 for v in decoder["other_cores"].values())
    assert "| other processes' cores while it ran (noise) |" in done.stdout
