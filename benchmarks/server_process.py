"""`python -m service` in a subprocess on a free port, for the benchmarks: its settings from keyword
arguments, its memory and CPU time from /proc, its batch sizes from /metrics."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from benchmarks.cpu_time import process_cpu_seconds
from harness.reliability.harness import wait_until_ready

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch_rows(url: str, model: str, phase: str) -> tuple[float, float]:
    """A model's runs so far in one phase ("prefill" or "decode"), from /metrics: (rows over all of them, how
    many runs)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    pattern = r'^serve_batch_size_{part}{{model="{model}",phase="{phase}"}} (\S+)$'
    found = [re.search(pattern.format(part=part, model=model, phase=phase), text, re.MULTILINE)
             for part in ("sum", "count")]
    rows, runs = (float(match.group(1)) if match else 0.0 for match in found)
    return rows, runs


class Server:
    """`python -m service` in a subprocess, with settings from the environment."""

    def __init__(self, artifacts: Path, threads: int, **settings: Any) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
        env |= {
            "SERVE_HOST": "127.0.0.1",
            "SERVE_PORT": str(self.port),
            "SERVE_ARTIFACTS_DIR": str(artifacts),
            "SERVE_INTRA_OP_THREADS": str(threads),
            "SERVE_LOG_LEVEL": "warning",
            "SERVE_MAX_QUEUE_SIZE": "1024",
            "SERVE_MAX_NEW_TOKENS": "256",
        }
        env |= {f"SERVE_{k.upper()}": str(v) for k, v in settings.items()}
        self.proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, cwd=REPO)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300) -> None:
        wait_until_ready(self.proc, self.url, timeout, poll_s=0.2)

    def __enter__(self) -> Server:
        self.wait_ready()
        return self

    def rss_mb(self) -> float:
        """The server's resident memory now (VmRSS, Linux)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return round(int(match.group(1)) / 1024, 1)

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory so far (VmHWM, Linux): what a container's memory limit must hold."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return round(int(match.group(1)) / 1024, 1)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server has used so far: cores busy = its growth / wall time."""
        return process_cpu_seconds(self.proc.pid)

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
