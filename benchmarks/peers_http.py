"""The servers benchmarks/peers.py drives over HTTP, one at a time on the same cores: ours (`python -m service`),
vLLM's CPU build (its OpenAI server) and a Python embedding server (sentence-transformers behind FastAPI), both
from .venv-peers; and the client of each row (OpenAI's /v1/completions and /v1/embeddings, greedy, `ignore_eos`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.peers_engines import Row, prompts, stream_rate, streams_summary
from benchmarks.peers_models import PEERS_PYTHON
from benchmarks.server_process import Server, free_port

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = httpx.Timeout(900.0)
# vLLM's CPU guide preloads tcmalloc (Debian's libtcmalloc-minimal4) and Intel's OpenMP: used where present
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def wait_for(proc: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"not ready after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def process_server(command: list[str], env: dict[str, str], ready_path: str, port: int,
                   log: Path, timeout: float = 900) -> Iterator[str]:
    """A server in a subprocess of its own group (what it leaves is killed with the group); output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(proc, url + ready_path, timeout, log)
        yield url
    finally:
        proc.terminate()  # the server stops its workers and waits for them (their CPU time counts as ours)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left


@contextlib.contextmanager
def ours(served: Path, model: str, threads: int) -> Iterator[str]:
    with Server(served, threads, models=model, max_input_tokens=4096, max_new_tokens=1024,
                max_queue_size=1024) as server:
        yield server.url


def peers_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVE_", "VIRTUAL_ENV"))}
    return env | {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@contextlib.contextmanager
def vllm(checkpoint: Path, model: str, dtype: str, threads: int, max_len: int, log: Path) -> Iterator[str]:
    """vLLM's OpenAI server on `threads` cores (VLLM_CPU_OMP_THREADS_BIND), a 4 GiB KV cache, Intel's OpenMP
    preloaded as its CPU guide says (tcmalloc too where the machine has it), default scheduling (prefix caching
    on: every prompt here is new, so it never hits)."""
    port = free_port()
    env = peers_env(threads) | {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "4"}
    preload = [TCMALLOC, PEERS_PYTHON.parent.parent / "lib" / "libiomp5.so"]  # libiomp5: intel-openmp
    env["LD_PRELOAD"] = ":".join(str(path) for path in preload if path.is_file())
    command = [str(PEERS_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
               "--served-model-name", model, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--max-model-len", str(max_len), "--seed", "0"]
    with process_server(command, env, "/v1/models", port, log) as url:
        yield url


async def complete(client: httpx.AsyncClient, model: str, prompt: list[int], new_tokens: int,
                   stream: bool) -> tuple[int, float, float, int]:
    """One greedy completion: (generated tokens, seconds to the first token, seconds to the last, tokens that
    came with the first)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0.0,
                            "ignore_eos": True}
    started = time.perf_counter()
    if not stream:
        answer = await client.post("/v1/completions", json=body)
        answer.raise_for_status()
        seconds = time.perf_counter() - started
        return int(answer.json()["usage"]["completion_tokens"]), seconds, seconds, 1
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    # Each token decodes to one word (benchmarks/peers_models.py): words count the tokens a chunk brings, so a
    # first chunk of several tokens is not taken for one.
    tokens, words, first_words, first, last = 0, 0, 0, 0.0, 0.0
    async with client.stream("POST", "/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            brought = sum(len(choice.get("text", "").split()) for choice in chunk.get("choices", []))
            if brought:
                words, last = words + brought, time.perf_counter() - started
                first, first_words = (first, first_words) if first else (last, words)
    return tokens, first, last, first_words


async def http_row(url: str, model: str, row: Row, vocab: int, seed: int) -> dict[str, float]:
    """`row` through /v1/completions: `concurrency` clients, each sending its next prompt when answered."""
    *items, warm = prompts(dataclasses.replace(row, requests=row.requests + 1), vocab, seed)
    stream = row.measure == "streams"
    limits = httpx.Limits(max_connections=row.concurrency + 1)
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT, limits=limits) as client:
        await complete(client, model, warm, 2, stream)  # warm-up at the row's prompt length (vLLM compiles)
        queue = list(items)
        results: list[tuple[int, float, float, int]] = []

        async def worker() -> None:
            while queue:
                results.append(await complete(client, model, queue.pop(0), row.new_tokens, stream))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(row.concurrency)))
        seconds = time.perf_counter() - started
    if any(r[0] != row.new_tokens for r in results):
        raise RuntimeError(f"{row.name}: generated {[r[0] for r in results]}, asked for {row.new_tokens}")
    if row.measure == "tokens_per_s":
        return {"tokens_per_s": round(sum(r[0] for r in results) / seconds, 1)}
    if row.measure == "prompt_tokens_per_s":
        return {"prompt_tokens_per_s": round(row.prompt * len(items) / seconds, 1)}
    return streams_summary([r[1] for r in results], [stream_rate(n, a, b, k) for n, a, b, k in results])


# --- encoders -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def ours_embedder(served: Path, model: str, threads: int) -> Iterator[str]:
    with Server(served, threads, models=model, max_batch_size=64, max_queue_size=1024) as server:
        yield server.url


@contextlib.contextmanager
def embedding_server(checkpoint: Path, model: str, threads: int, log: Path) -> Iterator[str]:
    """sentence-transformers behind FastAPI (benchmarks/peers_embed_server.py) on the same checkpoint."""
    port = free_port()
    command = [str(PEERS_PYTHON), "-m", "benchmarks.peers_embed_server", str(checkpoint), model, str(port),
               str(threads)]
    with process_server(command, peers_env(threads) | {"PYTHONPATH": str(REPO)}, "/health", port, log) as url:
        yield url


def sentences(vocab: int, words: int, count: int, seed: int) -> list[str]:
    """Sentences of `words` tokens of the word tokenizer (`w<id>`)."""
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in rng.integers(5, vocab, words)) for _ in range(count)]


async def embed_row(url: str, model: str, batch: int, requests: int, texts: list[str]) -> float:
    """Embeddings/s: `requests` requests of `batch` sentences each, one at a time."""
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        async def call(i: int) -> None:
            inputs = [texts[(i * batch + j) % len(texts)] for j in range(batch)]
            answer = await client.post("/v1/embeddings", json={"model": model, "input": inputs})
            answer.raise_for_status()
            assert len(answer.json()["data"]) == batch

        await call(0)  # warm-up
        started = time.perf_counter()
        for i in range(requests):
            await call(i + 1)
        return round(batch * requests / (time.perf_counter() - started), 1)
