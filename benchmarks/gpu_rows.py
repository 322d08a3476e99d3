"""The real-size rows of benchmarks/gpu_check.py: a random model in a real model's shape (SmolLM2-135M by default,
built by benchmarks/peers_models.py), our server on CUDA against CTranslate2 on CUDA (float32 and float16).

Rows (benchmarks/peers_engines.py's, with more requests each: a GPU answers one in milliseconds): prompt
processing of 1,000-token prompts, one request at a time (64 new tokens), 16 concurrent requests (128 new
tokens). Ours is `python -m service` with SERVE_DEVICE=cuda through /v1/completions; its /v1/models must say
CUDAExecutionProvider, or the rows are not ours on CUDA and the check fails. CTranslate2 runs in a process of its
own (benchmarks/peers_engines.py), a batch per group of concurrent requests. Every step takes at most what is left
of the check's time budget; a step it cannot start is recorded as skipped, with why.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from benchmarks import peers_http as http
from benchmarks.peers import medians
from benchmarks.peers_engines import ROWS, Row
from benchmarks.peers_models import SHAPES, Shape, folder, served
from benchmarks.server_process import Server

REPO = Path(__file__).resolve().parent.parent
ROW_NAMES = ("prefill1000", "single", "c16")
CT2_TYPES = ("float32", "float16")
PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}  # what ours must report, by device


class Budget:
    """Seconds left until an absolute deadline (time.time(): it crosses the re-exec of gpu_check)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def left(self) -> float:
        return self.deadline - time.time()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


def ct2_missing(device: str) -> str | None:
    """Why CTranslate2 cannot run on `device` here, or None."""
    try:
        import ctranslate2
    except ImportError:
        return "ctranslate2 is not installed (python -m benchmarks.gpu_wheels download --with-ct2, or PyPI)"
    if device == "cpu":
        return None
    if ctranslate2.get_cuda_device_count() == 0:
        return f"CTranslate2 {ctranslate2.__version__} sees no CUDA device"
    try:
        ctypes.CDLL("libcublas.so.12")
    except OSError:
        return (f"CTranslate2 {ctranslate2.__version__} is built for CUDA 12 and loads libcublas.so.12, which this "
                "machine lacks (the lent machines have CUDA 13 only; nvidia-cublas-cu12 is a 581 MB wheel)")
    return None


def build(shape: Shape, work: Path, threads: int, ct2: bool, budget: Budget) -> None:
    """The checkpoint, our import and (`ct2`) CTranslate2's conversion, each skipped when already built."""
    command = [sys.executable, "-m", "benchmarks.peers_models", shape.name, "--work", str(work), "--threads",
               str(threads), "--no-genai", *([] if ct2 else ["--no-ct2"])]
    subprocess.run(command, check=True, cwd=REPO, timeout=max(1.0, budget.left()))


def server_providers(url: str, model: str) -> dict[str, str]:
    answer = httpx.get(f"{url}/v1/models/{model}", timeout=30)
    answer.raise_for_status()
    providers: dict[str, str] = answer.json()["provider"]
    return providers


def row_of(name: str, args: Any) -> Row:
    row = ROWS[name].scaled(args.scale)
    return dataclasses.replace(row, requests=row.requests * args.requests_factor)


def ours(shape: Shape, work: Path, args: Any, budget: Budget) -> tuple[dict[str, Any], dict[str, str]]:
    """Our server on `args.device`: each row's rounds, and the providers it reported (checked before any row)."""
    server = Server(served(work, shape), args.threads, models=shape.name, device=args.device, max_input_tokens=4096,
                    max_new_tokens=1024, max_queue_size=1024)
    try:
        server.wait_ready(timeout=max(1.0, budget.left()))
        providers = server_providers(server.url, shape.name)
        if any(p != PROVIDERS[args.device] for p in providers.values()):
            return {}, providers
        rounds: dict[str, list[dict[str, float]]] = {}
        for round_ in range(args.rounds):
            for index, name in enumerate(ROW_NAMES):
                if not budget.allows(5):
                    return rounds, providers
                row = row_of(name, args)
                measure = http.http_row(server.url, shape.name, row, shape.vocab_size, seed=1000 * round_ + index)
                rounds.setdefault(name, []).append(asyncio.run(asyncio.wait_for(measure, budget.left())))
                print(f"  ours ({args.device}) round {round_ + 1} {name}: {rounds[name][-1]}", flush=True)
        return rounds, providers
    finally:
        server.__exit__()


def ct2(shape: Shape, work: Path, compute_type: str, args: Any, budget: Budget) -> dict[str, Any]:
    spec = {"rows": list(ROW_NAMES), "scale": args.scale, "rounds": args.rounds, "threads": args.threads,
            "vocab": shape.vocab_size, "compute_type": compute_type, "device": args.device,
            "requests_factor": args.requests_factor}
    command = [sys.executable, "-m", "benchmarks.peers_engines", "ct2", str(folder(work, shape) / "ct2"),
               json.dumps(spec)]
    # the environment gpu_check set: PYTHONPATH with the installed wheels, LD_LIBRARY_PATH with the CUDA libraries
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True, check=True,
                          timeout=max(1.0, budget.left()))
    rounds: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return rounds


def failure(exc: BaseException) -> str:
    if isinstance(exc, subprocess.TimeoutExpired | TimeoutError):
        return "the time budget ran out during this step"
    return "failed: " + traceback.format_exception_only(exc)[-1].strip()[-1500:]


def measure(args: Any, budget: Budget) -> dict[str, Any]:
    """The rows of `args.model` on ours and CTranslate2 (both on `args.device`). `error` is set when ours is not
    really on that device: a failure of the check, not a skipped row."""
    shape = SHAPES[args.model]
    result: dict[str, Any] = {"model": shape.name, "device": args.device, "config": shape.config,
                              "rows": list(ROW_NAMES), "scale": args.scale,
                              "rounds": args.rounds, "requests_factor": args.requests_factor, "engines": {},
                              "skipped": {}, "error": None}
    no_ct2 = ct2_missing(args.device)
    types = CT2_TYPES if args.device == "cuda" else CT2_TYPES[:1]  # CTranslate2 has no float16 on the CPU
    engines = ["ours"] + ([] if no_ct2 else [f"ct2-{t}" for t in types])
    result["skipped"] |= {f"ct2-{t}": no_ct2 for t in types if no_ct2}
    started = time.time()
    try:
        build(shape, args.work, args.threads, ct2=not no_ct2, budget=budget)
        result["build_s"] = round(time.time() - started, 1)
    except (subprocess.SubprocessError, OSError) as exc:
        result["skipped"] |= {engine: f"the model's build {failure(exc)}" for engine in engines}
        return result
    for engine in engines:
        if not budget.allows(30):
            result["skipped"][engine] = f"the time budget ({args.budget_s:.0f} s) ran out before it started"
            continue
        print(f"{shape.name} on {args.device}: {engine}", flush=True)
        try:
            if engine == "ours":
                rounds, providers = ours(shape, args.work, args, budget)
                result["ours_providers"] = providers
                if any(p != PROVIDERS[args.device] for p in providers.values()):
                    result["error"] = f"our server runs {shape.name} on {providers}, not {PROVIDERS[args.device]}"
                    result["skipped"][engine] = result["error"]
                    continue
            else:
                rounds = ct2(shape, args.work, engine.removeprefix("ct2-"), args, budget)
        except Exception as exc:  # one engine's failure is recorded; the others still run
            result["skipped"][engine] = failure(exc)
            continue
        if rounds:
            result["engines"][engine] = medians(rounds)
        missing = [row for row in ROW_NAMES if row not in rounds]
        if missing and engine not in result["skipped"]:
            result["skipped"][engine] = f"rows {missing}: the time budget ran out"
    return result

