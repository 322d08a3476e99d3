"""`python -m service` for real: serves on SERVE_HOST:SERVE_PORT, and drains on SIGTERM."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(artifacts: Path, **settings: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m service` on a free loopback port with these SERVE_* settings (lower case, without the
    prefix); its stderr piped. Popen returns at once: an async test's loop never waits on the process."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {"SERVE_HOST": "127.0.0.1", "SERVE_PORT": str(port), "SERVE_ARTIFACTS_DIR": str(artifacts),
            "SERVE_INTRA_OP_THREADS": "1", "SERVE_LOG_LEVEL": "warning"}
    env |= {f"SERVE_{name.upper()}": value for name, value in settings.items()}
    proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{port}"


async def wait_ready(client: httpx.AsyncClient) -> None:
    for _ in range(300):
        try:
            if (await client.get("/ready")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("api_processes", [1, 2])
async def test_sigterm_drains_then_exits(tiny_artifacts: Path, api_processes: int) -> None:
    """In one process, or with the HTTP front end in two (the signal reaches the engine process, which
    passes it on)."""
    proc, url = start_server(
        tiny_artifacts,
        models="generator,classifier",
        max_batch_size="1",
        max_new_tokens="120",
        drain_timeout_s="30",
        api_processes=str(api_processes),
    )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await wait_ready(client)
            assert (await client.get("/health")).status_code == 200
            # One sequence at a time: these keep the server busy for a while.
            req = {"prompt": "Hi", "max_new_tokens": 120, "ignore_eos": True}
            busy = [asyncio.ensure_future(client.post("/v1/generate", json=req)) for _ in range(6)]
            while "serve_inflight_requests 6.0" not in (await client.get("/metrics")).text:
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            for _ in range(300):  # the signal lands asynchronously: /ready turns 503 within moments
                ready = await client.get("/ready")
                if ready.status_code == 503:
                    break
                await asyncio.sleep(0.005)
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert proc.poll() is None  # still serving the in-flight requests
            refused = await client.post("/v1/classify", json={"text": "hi"})
            assert refused.status_code == 503
            done = await asyncio.gather(*busy)
            assert [r.status_code for r in done] == [200] * 6
            assert all(r.json()["usage"]["completion_tokens"] == 120 for r in done)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def test_a_front_end_that_dies_stops_the_server(tiny_artifacts: Path) -> None:
    """SERVE_API_PROCESSES=2: a front-end process killed is a failure (exit status 1, the other front end
    stops too), for the orchestrator to restart the server; the engine killed ends its front ends."""
    for victim in ("front end", "engine"):
        proc, url = start_server(tiny_artifacts, models="classifier", api_processes="2")
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                await wait_ready(client)
                assert (await client.post("/v1/classify", json={"text": "hi"})).status_code == 200
            fronts = children(proc.pid)
            assert len(fronts) == 2
            if victim == "front end":
                os.kill(fronts[0], signal.SIGKILL)
                assert proc.wait(timeout=20) == 1
                assert "a front-end process exited unexpectedly" in (proc.stderr.read() if proc.stderr else "")
            else:
                proc.kill()
                proc.wait()
            for _ in range(200):  # the front ends exit (their parent was the server: init reaps them)
                if not any(_running(pid) for pid in fronts):
                    break
                await asyncio.sleep(0.05)
            assert not any(_running(pid) for pid in fronts), victim
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waits only for its parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (FileNotFoundError, IndexError):
        return False
    return "zombie" not in state
