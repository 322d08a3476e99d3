"""benchmarks/gpu_check.py without a GPU: a CPU-only onnxruntime, or a CUDA provider that is listed but not used,
must fail loudly (a CPU-only build once passed benchmarks.cuda_check with exit 0 and "cuda": false); the verdict,
the table, and the wheels cut into folders a device call can carry and put together again."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import gpu_check, gpu_wheels

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path / "gpu_check.json"),
               "--site", str(tmp_path / "site"), *options]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_a_cpu_only_onnxruntime_fails_the_provider_check(tmp_path: Path) -> None:
    done = run(tmp_path, "--no-install")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "GPU CHECK FAILED: onnxruntime" in done.stderr
    assert "has no CUDAExecutionProvider" in done.stderr and "A CPU-only build" in done.stderr
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert record["status"] == "failed" and record["cuda"] is False
    assert "CUDAExecutionProvider" not in record["available_providers"]
    assert "parity" not in record and "rows" not in record  # nothing measured on the CPU in CUDA's name
    assert "CUDAExecutionProvider in use: NO" in (tmp_path / "gpu_check.md").read_text()


def test_without_a_gpu_nothing_is_installed(tmp_path: Path) -> None:
    no_tools = tmp_path / "bin"  # a PATH without nvidia-smi
    no_tools.mkdir()
    done = run(tmp_path, env=os.environ | {"PATH": str(no_tools)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no NVIDIA GPU is visible here" in done.stderr
    assert not (tmp_path / "site").exists()


class FakeOrt:
    """onnxruntime as a CUDA build sees it on a machine whose CUDA libraries do not load, or do."""

    __version__ = "1.31.1"
    __file__ = "/site/onnxruntime/__init__.py"

    def __init__(self, session_runs_on: str) -> None:
        self.session_runs_on = session_runs_on

    def get_available_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def InferenceSession(self, path: str, providers: list[str]) -> Any:  # onnxruntime's name
        assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return SimpleNamespace(get_providers=lambda: [self.session_runs_on, "CPUExecutionProvider"])


def test_a_listed_cuda_provider_that_falls_back_fails() -> None:
    info, error = gpu_check.provider_check(FakeOrt("CPUExecutionProvider"), gpu_check.PROBE_GRAPH)
    assert error is not None and "is listed but a session asked for it runs on CPUExecutionProvider" in error
    assert info["cuda"] is False
    info, error = gpu_check.provider_check(FakeOrt("CUDAExecutionProvider"), gpu_check.PROBE_GRAPH)
    assert error is None and info["cuda"] is True


def parity(passed: bool, provider: str = "CUDAExecutionProvider") -> dict[str, Any]:
    return {"providers": {"decoder": provider}, "max_abs_logit_diff": 0.002 if passed else 0.4,
            "mean_abs_logit": 2.1, "greedy_token_agreement": 1.0 if passed else 0.9, "sequences_equal_share": 1.0,
            "passed": passed}


def rows(error: str | None = None) -> dict[str, Any]:
    measured = {"ours": {"prefill1000": {"prompt_tokens_per_s": 20000.0}, "single": {"tokens_per_s": 300.0}},
                "ct2-float32": {"prefill1000": {"prompt_tokens_per_s": 10000.0}, "single": {"tokens_per_s": 400.0}}}
    return {"model": "smollm2-135m", "device": "cuda", "scale": 1.0, "rows": ["prefill1000", "single", "c16"],
            "engines": measured, "skipped": {"ct2-float16": "the time budget ran out before it started"},
            "error": error}


@pytest.mark.parametrize(("record", "code", "why"), [
    ({"cuda": True, "parity": {"generator": parity(True)}, "rows": rows()}, 0, ""),
    ({"cuda": True, "parity": {"generator": parity(False)}}, 1, "generator: parity beyond the thresholds"),
    ({"cuda": True, "parity": {"generator": parity(True, "CPUExecutionProvider")}}, 2, "sessions run on"),
    ({"cuda": True, "rows": rows("our server runs smollm2-135m on CPU")}, 2, "our server runs"),
    ({"cuda": True, "parity": {"translator": {"skipped": "the time budget ran out"}}}, 0, ""),
    ({"cuda": False, "error": "no CUDA"}, 2, "no CUDA"),
])
def test_verdict(record: dict[str, Any], code: int, why: str) -> None:
    found, reasons = gpu_check.verdict(record)
    assert found == code and why in "; ".join(reasons)


def test_table_shows_each_engine_and_ratio(tmp_path: Path) -> None:
    record = {"cuda": True, "gpu": {"name": "NVIDIA H100", "driver": "580", "memory": "81559 MiB"},
              "onnxruntime": "1.31.1", "parity": {"generator": parity(True)}, "rows": rows()}
    out = tmp_path / "gpu_check.json"
    assert gpu_check.finish(record, argparse.Namespace(out=out)) == 0
    text = out.with_suffix(".md").read_text()
    assert "GPU: NVIDIA H100 (driver 580, 81559 MiB); onnxruntime 1.31.1; CUDAExecutionProvider in use: yes" in text
    assert "| generator | 0.002 | 2.1 | 1.000 | 1.00 | yes |" in text
    assert "| smollm2-135m shape, on cuda | ours | ct2-float32 | ours / ct2-float32 |" in text
    assert "| prompt processing, 1,000-token prompts (prompt tok/s) | 20,000.0 | 10,000.0 | 2.00 |" in text
    assert "| 16 concurrent, 64-token prompts, 128 new tokens (tok/s) |  |  |  |" in text
    assert "skipped ct2-float16: the time budget ran out before it started" in text
    assert json.loads(out.read_text())["status"] == "passed"


def test_wheels_travel_in_folders_and_come_back_whole(tmp_path: Path) -> None:
    big, small = tmp_path / "big-1.0-py3-none-any.whl", tmp_path / "small-1.0-py3-none-any.whl"
    big.write_bytes(bytes(range(256)) * 10)  # 2,560 bytes: 3 parts of at most 1,000
    small.write_bytes(b"x" * 300)
    folders = gpu_wheels.split([big, small], tmp_path / "carry", part_bytes=1000)
    assert len(folders) == 3  # the small wheel beside the last part
    assert all(sum(p.stat().st_size for p in f.iterdir() if p.name != gpu_wheels.SUMS) <= 1000 for f in folders)
    whole = gpu_wheels.gather(folders, tmp_path / "whole")
    assert {p.name: p.read_bytes() for p in whole} == {big.name: big.read_bytes(), small.name: small.read_bytes()}
    with pytest.raises(gpu_wheels.WheelError, match=r"parts \[2\] of 3 are missing"):
        gpu_wheels.gather([folders[0], folders[2]], tmp_path / "again")
    next(folders[1].glob("*.part-2-of-3")).write_bytes(b"0" * 1000)  # cut short or mixed up
    with pytest.raises(gpu_wheels.WheelError, match="sha256"):
        gpu_wheels.gather(folders, tmp_path / "corrupt")
