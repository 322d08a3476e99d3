"""benchmarks/process_threads.py end to end at a small scale: the engine's and each front end's threads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_process_threads_tells_the_engine_from_the_front_ends() -> None:
    command = [sys.executable, "-m", "benchmarks.process_threads", "--client", "classify", "--concurrency", "4",
               "--requests", "60", "--api-processes", "2", "--threads", "1"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("classify, 4 concurrent, SERVE_API_PROCESSES=2:") for line in lines), done.stdout
    for kind in ("engine: event loop", "engine: workers and ONNX Runtime", "front end 1: event loop",
                 "front end 2: event loop"):
        assert any(line.strip().startswith(f"{kind}:") and line.endswith("us/request") for line in lines), kind
