"""What bursts of requests leave a server holding, and what returning it costs.

    python -m benchmarks.memory_bursts [bursts] [--concurrency 96] [--rounds 3] [--settle-s 10]
                                       [--max-new-tokens 200] [--setting NAME=VALUE ...]
    python -m benchmarks.memory_bursts runs [--threads 0] [--blocks 10]

`bursts` (the default): RSS of a real `python -m service` (the committed artifacts, the default models and
settings, as the container runs them) before a burst, at its peak, and `--settle-s` seconds after, per
route, over several rounds. A round fires `--concurrency` concurrent requests at each route in turn
(/v1/embeddings, /embed, /v1/classify, /v1/generate with `--max-new-tokens` tokens, /tokenize, and
/v1/chat/completions; a route whose model is not served, chat often, is left out), waiting `--settle-s`
after each. RSS is the server's and its children's (SERVE_API_PROCESSES > 1), from /proc; `--setting`
sets any environment variable of the server (SERVE_MEMORY_TRIM_IDLE_S=0, MALLOC_ARENA_MAX=2). `kept_mb` is
RSS after settling minus RSS before the first burst: what the target bounds.

`runs`: what ONNX Runtime's CPU arena is worth on the hot path, in process: the committed graphs' runs
(single texts, batches, decode steps) with the arena on and off (glibc's thresholds fixed, as the engine
does), in alternating blocks: median ms and page faults per run.

Each prints a Markdown table and writes the JSON (bench_results/memory_bursts.json, memory_runs.json).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.record import write_record
from contract.names import LOGITS_TO_KEEP
from harness.reliability.harness import LocalServer, rss_mb
from service.engine.heap_trim import hold_freed_memory
from service.runtime.artifact import load_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions, Tensor

REPO = Path(__file__).resolve().parent.parent
TEXT = (
    "The committee approved the new budget after a long debate about schools, roads and the harbour; "
    "the vote was close and several members asked for the figures to be checked again next spring."
)
PROMPT = "Once upon a time, in a small village by the sea,"


def routes(max_new_tokens: int, text: str = TEXT) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each route's path and request body."""
    return {
        "embeddings": ("/v1/embeddings", {"input": text}),
        "embed": ("/embed", {"inputs": text}),
        "classify": ("/v1/classify", {"text": text}),
        "generate": (
            "/v1/generate",
            {"prompt": PROMPT, "max_new_tokens": max_new_tokens, "ignore_eos": True, "seed": 0},
        ),
        "tokenize": ("/tokenize", {"prompt": text}),
        "chat": (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": text}], "max_tokens": max_new_tokens},
        ),
    }


def tree(pid: int) -> list[int]:
    """A process and its children (the front ends of SERVE_API_PROCESSES > 1)."""
    return [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]


def tree_rss_mb(pid: int) -> float:
    return sum(rss_mb(p) for p in tree(pid))


def tree_page_faults(pid: int) -> int:
    """Minor page faults so far (/proc/<pid>/stat's minflt): memory handed back and touched again."""
    return sum(int(Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[7]) for p in tree(pid))


async def burst(server: LocalServer, http: httpx.AsyncClient, path: str, body: dict[str, Any], n: int,
                settle_s: float) -> dict[str, Any]:
    """`n` concurrent requests; RSS before, sampled during (the peak) and `settle_s` after the last answer."""
    pid = server.proc.pid
    before, faults = tree_rss_mb(pid), tree_page_faults(pid)
    peak, done = [before], asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            peak.append(tree_rss_mb(pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.ensure_future(sample())
    started = time.perf_counter()
    answers = await asyncio.gather(*(http.post(path, json=body) for _ in range(n)), return_exceptions=True)
    seconds = time.perf_counter() - started
    faults = tree_page_faults(pid) - faults
    done.set()
    await sampler
    await asyncio.sleep(settle_s)
    statuses = Counter(a.status_code if isinstance(a, httpx.Response) else type(a).__name__ for a in answers)
    return {
        "statuses": {str(k): v for k, v in statuses.items()},
        "burst_s": round(seconds, 2),
        "page_faults_k": round(faults / 1000, 1),
        "rss_before_mb": round(before),
        "rss_peak_mb": round(max(peak)),
        "rss_after_mb": round(tree_rss_mb(pid)),
    }


async def measure(server: LocalServer, args: argparse.Namespace) -> dict[str, Any]:
    bodies = routes(args.max_new_tokens, args.text)
    async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=httpx.Limits(max_connections=None)) as http:
        for name, (path, body) in list(bodies.items()):
            answer = await http.post(path, json=body)
            if answer.status_code == 404 or (name == "chat" and answer.status_code == 400):  # no model for it
                del bodies[name]
            elif answer.status_code != 200:
                raise SystemExit(f"{path}: HTTP {answer.status_code} {answer.text[:300]}")
        await asyncio.sleep(args.settle_s)
        start = round(tree_rss_mb(server.proc.pid))
        rows = []
        for round_ in range(1, args.rounds + 1):
            for name, (path, body) in bodies.items():
                figures = await burst(server, http, path, body, args.concurrency, args.settle_s)
                rows.append({"round": round_, "route": name, **figures, "kept_mb": figures["rss_after_mb"] - start})
                print(f"  round {round_} {name:<10} {figures}", flush=True)
    return {"rss_start_mb": start, "bursts": rows, "kept_mb_max": max(r["kept_mb"] for r in rows)}


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


# --- runs: the arena on and off, in process -----------------------------------------------------------

Case = tuple[str, str, dict[str, Tensor], list[str]]  # (label, model, feeds, outputs)


def cases(artifacts: Path) -> list[Case]:
    """Single texts and batches of the encoders; the generator's prefill and decode steps (positions cut to
    what a smaller artifact's context holds)."""
    rng = np.random.default_rng(0)
    out: list[Case] = []
    for name in ("classifier-minilm", "embedder", "classifier"):
        if not (artifacts / name / "config.json").is_file():
            continue
        artifact = load_artifact(artifacts / name)
        spec, length = artifact.graphs["encoder"], min(40, artifact.max_positions)
        names = {i.name for i in spec.inputs}
        for rows in (1, 32):
            feeds: dict[str, Tensor] = {"input_ids": rng.integers(5, artifact.vocab_size, (rows, length)),
                                        "attention_mask": np.ones((rows, length), np.int64)}
            if "token_type_ids" in names:
                feeds["token_type_ids"] = np.zeros((rows, length), np.int64)
            first = next(o.name for o in spec.outputs if not o.name.startswith("attentions"))
            out.append((f"{name} {rows}x{length}", name, feeds, [first]))
    generator = load_artifact(artifacts / "generator")
    layers, heads, width = generator.n_decoder_layers, generator.n_kv_heads, generator.d_head
    last = {LOGITS_TO_KEEP: np.array(1, np.int64)} if generator.graphs["decoder"].keeps_last_logits else {}
    kv = [f"{i}.{part}" for i in range(layers) for part in ("key", "value")]
    for rows, past, new in ((1, 0, 12), (16, 0, 64), (1, 100, 1), (64, 100, 1), (96, 200, 1)):
        new = min(new, generator.max_positions)
        past = min(past, generator.max_positions - new)
        feeds = {"input_ids": rng.integers(5, generator.vocab_size, (rows, new)),
                 "attention_mask": np.ones((rows, past + new), np.int64),
                 "position_ids": np.tile(np.arange(past, past + new), (rows, 1))}
        feeds |= {f"past_key_values.{n}": rng.standard_normal((rows, heads, past, width), np.float32) for n in kv}
        feeds |= last  # the last position's logits only, as the server asks
        label = f"generator {rows} rows, {past} past, {new} new"
        out.append((label, "generator", feeds, ["logits", *(f"present.{n}" for n in kv)]))
    return out


def compare_runs(artifacts: Path, threads: int, blocks: int) -> list[dict[str, Any]]:
    """Median ms and page faults per run with the arena on and off (glibc's thresholds fixed, and the runs
    on a thread of their own, as in the engine): blocks of 5 runs each, alternating which goes first. Page
    faults do not depend on what else the machine runs; the times do."""
    hold_freed_memory()
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(_compare_runs, artifacts, threads, blocks).result()


def _compare_runs(artifacts: Path, threads: int, blocks: int) -> list[dict[str, Any]]:
    sessions: dict[tuple[str, bool], GraphSession] = {}
    rows = []
    for label, model, feeds, outputs in cases(artifacts):
        for arena in (True, False):
            if (model, arena) not in sessions:
                artifact = load_artifact(artifacts / model)
                options = RuntimeOptions(device="cpu", intra_op_threads=threads, cpu_mem_arena=arena)
                weights = artifact.weights_package.load() if artifact.weights_package else None
                sessions[model, arena] = GraphSession(model, next(iter(artifact.graphs.values())), options,
                                                      initializers=weights)
            for _ in range(3):  # warm-up
                sessions[model, arena].run(feeds, outputs)
        times: dict[bool, list[float]] = {True: [], False: []}
        faults = {True: 0, False: 0}
        for block in range(blocks):
            for arena in (True, False) if block % 2 else (False, True):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                for _ in range(5):
                    started = time.perf_counter()
                    sessions[model, arena].run(feeds, outputs)
                    times[arena].append(time.perf_counter() - started)
                faults[arena] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        on, off = (statistics.median(times[a]) * 1000 for a in (True, False))
        rows.append({"case": label, "arena_ms": round(on, 3), "no_arena_ms": round(off, 3),
                     "ratio": round(off / on, 3), "arena_faults": round(faults[True] / len(times[True])),
                     "no_arena_faults": round(faults[False] / len(times[False]))})
        print(f"  {rows[-1]}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=("bursts", "runs"), default="bursts")
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=10.0, help="wait after each burst before reading RSS")
    parser.add_argument("--max-new-tokens", type=int, default=200, help="tokens per /v1/generate (and chat) request")
    parser.add_argument("--setting", action="append", default=[], help="NAME=VALUE in the server's environment")
    parser.add_argument("--text", default=TEXT, help="the text of each embeddings, classify and tokenize request")
    parser.add_argument("--threads", type=int, default=0, help="runs: intra-op threads (0: ONNX Runtime's choice)")
    parser.add_argument("--blocks", type=int, default=10, help="runs: alternating blocks of 5 runs per arm")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or REPO / "bench_results" / f"memory_{args.mode}.json"
    if args.mode == "runs":
        rows = compare_runs(args.artifacts, args.threads, args.blocks)
        geomean = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
        print()
        print(table(rows, ["case", "arena_ms", "no_arena_ms", "ratio", "arena_faults", "no_arena_faults"]))
        print(f"\nno arena / arena, geometric mean: {geomean:.3f}")
        options = (("threads", args.threads), ("blocks", args.blocks))
        write_record("memory_bursts runs", options, out, runs=rows, ratio_geomean=round(geomean, 3))
        return
    settings = dict(item.split("=", 1) for item in args.setting)
    with LocalServer(args.artifacts, base={"SERVE_LOG_LEVEL": "warning"}, **settings) as server:
        server.wait_ready(timeout=300)
        figures = asyncio.run(measure(server, args))
    print()
    cols = ["round", "route", "statuses", "burst_s", "page_faults_k", "rss_before_mb", "rss_peak_mb", "rss_after_mb",
            "kept_mb"]
    print(table(figures["bursts"], cols))
    print(f"\nRSS at the start {figures['rss_start_mb']} MB; most kept {args.settle_s:g} s after a burst: "
          f"{figures['kept_mb_max']} MB")
    given = (("concurrency", args.concurrency), ("rounds", args.rounds), ("settle-s", args.settle_s),
             ("max-new-tokens", args.max_new_tokens), *(("setting", s) for s in args.setting))
    write_record("memory_bursts bursts", given, out, settings=settings, concurrency=args.concurrency, **figures)


if __name__ == "__main__":
    main()
