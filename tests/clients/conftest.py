"""A real server (`python -m service` on the committed artifacts, on a free local port) for the tests that
drive it with the clients people use: the OpenAI SDK, huggingface_hub's InferenceClient, lm-evaluation-
harness and a headless Chromium."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import REAL_ARTIFACTS, REPO


@dataclass
class Server:
    url: str
    log: Path

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {
        **os.environ,
        "SERVE_HOST": "127.0.0.1",
        "SERVE_PORT": str(port),
        "SERVE_ARTIFACTS_DIR": str(REAL_ARTIFACTS),
        "SERVE_INTRA_OP_THREADS": "1",
        "SERVE_INTER_OP_THREADS": "1",
        "SERVE_LOG_FORMAT": "json",
    }
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not ready in 180 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield Server(url, log)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
