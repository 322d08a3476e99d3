"""Our server against CTranslate2 and Hugging Face eager on the same shapes, in one run (issue 11, item 7).

    pip install -e '.[train,bench]'       # ctranslate2 (the dev extra includes it too)
    python -m benchmarks.anchor [--artifacts artifacts] [--rounds 3] [--threads 2] [--out bench_results/anchor.json]

Models, all with the dimensions of --artifacts and random weights (nothing is downloaded):
  - ours: the artifacts re-exported with random weights by model/export/graphs.py (a trained translator stops at
    its end token early; /v1/translate has no way to force a length), served by `python -m service`
    (SERVE_INTRA_OP_THREADS=--threads), float32 and int8, driven over HTTP by benchmarks/http_load.py's client;
    --ours as-is serves --artifacts themselves (e.g. tiny random ones);
    the embedder is the served one (artifacts/embedder, through POST /v1/embeddings);
  - Hugging Face `transformers` built with the same dimensions: GPT-2 (generator), Marian (translator),
    BERT (classifier; BertModel for the embedder, mean pooling and normalisation after it), eager PyTorch
    with torch.set_num_threads(--threads);
  - CTranslate2 on those models converted by its TransformersConverter, float32 and int8, intra_threads=--threads
    (the BERT conversion stops at the pooler: the 2-label head, and the embedder's mean pooling and
    normalisation of last_hidden_state, run in numpy).
  - the Llama-shaped rows (--llama-size): a random transformers LlamaForCausalLM (grouped-query attention,
    SwiGLU, rope) built here, imported by our importer (model/importing/hf_artifact.py) and served by a server of its
    own, converted for CTranslate2 from the same weights; no HF eager row. Before measuring, ours in process
    and CTranslate2 decode a few prompts greedily and the run prints whether their tokens agree;
  - the floor: benchmarks/http_floor.py, a server that answers the same requests at once with no work,
    driven by the same client. `ceiling over HTTP / CT2` = floor / (ct2 + floor): ours / CT2 for an engine exactly as
    fast as CTranslate2 behind a server that costs nothing beyond uvicorn and the load generator on these
    cores. A target above it cannot be met on this machine by any server behind uvicorn.
Every engine decodes greedily or with the same beams, with lengths forced (ignore_eos; min = max length).
Each round measures every row on every engine back to back; a ratio is ours / theirs within a round, and the
table shows medians over the rounds. Batch engines get the concurrent requests as one batch (16 or 32).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.anchor_engines import (
    ANCHOR_MODELS,
    KINDS,
    PARTS,
    ROWS,
    SOURCE,
    TEXT,
    AnchorModel,
    Shapes,
    build_hf_and_ct2,
    dims,
    export_random,
    exporter_digest,
    shape_options,
)
from benchmarks.cpu_time import client_cpu_seconds, machine_cpu_seconds, process_cpu_seconds
from benchmarks.http_floor import FloorServer
from benchmarks.http_load import Cell, Client, Connection, _ok, drive
from benchmarks.server_process import Server, free_port

REPO = Path(__file__).resolve().parent.parent


def model_of(row: str) -> AnchorModel[Any]:
    """The model a row runs on (benchmarks/anchor_engines.py's ANCHOR_MODELS)."""
    return ANCHOR_MODELS[PARTS[row]]


def row_kind(row: str) -> str:
    """The artifact a row runs on."""
    return model_of(row).artifact


class Ours:
    """HTTP clients for our server (benchmarks/http_load.py's Connection and drive); lengths forced with ignore_eos."""

    def __init__(self, shapes: Shapes) -> None:
        self.s = shapes
        self.gaps: list[list[float]] = []  # per streamed request: its inter-token gaps, seconds
        self.lengths: list[int] = []

    def generate(self, stream: bool, model: str, prompt: list[int]) -> Client:
        body = {"model": model, "prompt": prompt, "max_new_tokens": self.s.new_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream": stream}

        async def call(conn: Connection) -> tuple[int, float | None]:
            conn.event_times = [] if stream else None
            status, data, events, first = await conn.post("/v1/generate", body)
            if stream:
                _ok(status, data)
                if b"event: error" in data:
                    raise RuntimeError("error event")
                assert conn.event_times is not None
                self.gaps.append(list(np.diff(conn.event_times)))
                self.lengths.append(events)
                return events, first
            tokens = int(_ok(status, data)["usage"]["completion_tokens"])
            self.lengths.append(tokens)
            return tokens, None
        return call

    def translate(self, beams: int) -> Client:
        body = {"model": "translator", "text": SOURCE, "num_beams": beams, "max_new_tokens": self.s.target_tokens,
                "no_repeat_ngram_size": 0, "length_penalty": 1.0}

        async def call(conn: Connection) -> tuple[int, float | None]:
            status, data, _, _ = await conn.post("/v1/translate", body)
            tokens = sum(t["output_tokens"] for t in _ok(status, data)["translations"])
            self.lengths.append(tokens)
            return tokens, None
        return call

    async def classify(self, conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post("/v1/classify", {"model": "classifier", "text": TEXT})
        _ok(status, data)
        self.lengths.append(0)
        return 1, None

    async def embed(self, conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post("/v1/embeddings", {"model": "embedder", "input": TEXT})
        _ok(status, data)
        self.lengths.append(0)
        return 1, None


# --- measuring ---------------------------------------------------------------------------------------------


def over_http(url: str, ours: Ours, client: Client, concurrency: int, requests: int) -> tuple[float, list[int]]:
    ours.gaps, ours.lengths = [], []
    cell: Cell = asyncio.run(drive(url, "anchor", client, concurrency, requests))
    if cell.errors:
        raise RuntimeError(f"{cell.errors} of {requests} requests failed")
    skip = concurrency  # drive's untimed warm-up requests come first
    ours.gaps, ours.lengths = ours.gaps[skip:], ours.lengths[skip:]
    return cell.tokens / cell.seconds, ours.lengths


class Worker:
    """An engine in its own process (benchmarks/anchor_engines.py)."""

    def __init__(self, engine: str, part: str, argv: list[str]) -> None:
        self.engine, self.part = engine, part
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.anchor_engines", engine, part, *argv],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if request:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.engine} {self.part} worker exited with {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def measure(self, row: str, concurrency: int, requests: int) -> tuple[float, list[int]]:
        out = self.ask({"row": row, "concurrency": concurrency, "requests": requests})
        value: float = out["value"]
        lengths: list[int] = out["lengths"]
        return value, lengths

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure_round(servers: dict[str, Server], floor: FloorServer, ours: Ours, workers: dict[tuple[str, str], Worker],
                  scale: float, rows: list[str]) -> dict[str, Any]:
    clients = {key: ROWS[key].http(ours, ours.s) for key in rows}

    def ours_cpu() -> float:
        processes: list[Server | Worker] = [*servers.values(), *workers.values()]
        return (client_cpu_seconds() + process_cpu_seconds(floor.proc.pid)
                + sum(x.cpu_seconds() for x in processes))

    out: dict[str, Any] = {}
    for key in rows:
        concurrency = ROWS[key].concurrency
        requests = max(concurrency, round(ROWS[key].requests * scale))
        before = (time.perf_counter(), machine_cpu_seconds(), ours_cpu())
        url = servers[model_of(key).server].url
        row: dict[str, Any] = {"lengths": {}}
        row["ours"], lengths = over_http(url, ours, clients[key], concurrency, requests)
        row["lengths"]["ours"] = sorted(set(lengths))
        if key == "generator_c16_stream":  # the other engines' numbers are those of generator_c16
            gaps = np.concatenate([np.zeros(0), *map(np.asarray, ours.gaps)]) * 1000
            out["inter_token_ms"] = {"p50": float(np.percentile(gaps, 50)), "p99": float(np.percentile(gaps, 99))}
        time.sleep(0.1)
        # The same requests, 10 times as many: the floor answers them 5-100 times faster than a model does.
        row["floor"], _ = over_http(floor.url, ours, clients[key], concurrency, 10 * requests)
        for name in ("engine", "ct2", "hf"):
            if key == "generator_c16_stream":
                row[name], row["lengths"][name] = out["generator_c16"][name], out["generator_c16"]["lengths"][name]
            elif (name, PARTS[key]) in workers:
                time.sleep(0.1)  # let the last engine's spinning threads go idle
                row[name], lengths = workers[name, PARTS[key]].measure(key, concurrency, requests)
                row["lengths"][name] = sorted(set(lengths))
            else:
                row[name] = row["lengths"][name] = None
        row["ours_per_ct2"] = row["ours"] / row["ct2"]
        # An engine as fast as CTranslate2 behind a server that costs what the floor does: on the same cores
        # their times per unit add up (one request at a time, or all cores busy), 1 / (1 / ct2 + 1 / floor).
        row["ceiling_per_ct2"] = row["floor"] / (row["ct2"] + row["floor"])
        row["engine_per_ct2"] = row["engine"] / row["ct2"] if row["engine"] else None
        row["ours_per_hf"] = row["ours"] / row["hf"] if row["hf"] else None
        now = (time.perf_counter(), machine_cpu_seconds(), ours_cpu())
        wall, machine, mine = (a - b for a, b in zip(now, before, strict=True))
        row["other_cores"] = round(max(0.0, machine - mine) / wall, 2)  # CPU that other processes took: noise
        print(f"  {key:<24} ours {row['ours']:>9.1f}  engine {row['engine'] or float('nan'):>9.1f}  "
              f"ct2 {row['ct2'] or float('nan'):>9.1f}  "
              f"hf {row['hf'] or float('nan'):>9.1f}  ours/ct2 {row['ours_per_ct2']:.2f}  "
              f"ceiling {row['ceiling_per_ct2']:.2f}  other cores {row['other_cores']}", flush=True)
        out[key] = row
        time.sleep(0.1)
    return out


def summarize(rounds: list[dict[str, Any]], rows: list[str], shapes: Shapes) -> dict[str, Any]:
    def med(values: list[float | None], digits: int) -> float | None:
        numbers = [v for v in values if v is not None]  # an engine measured in one round is measured in all
        return None if values[0] is None else round(statistics.median(numbers), digits)

    out: dict[str, Any] = {}
    for key in rows:
        workload, unit, concurrency = ROWS[key].workload, ROWS[key].unit, ROWS[key].concurrency
        per = [r[key] for r in rounds]
        lengths = per[-1]["lengths"]
        out[key] = {
            "workload": workload, "unit": unit, "concurrency": concurrency,
            **{e: med([p[e] for p in per], 1) for e in ("ours", "engine", "ct2", "hf", "floor")},
            **{k: med([p[k] for p in per], 3)
               for k in ("ours_per_ct2", "ours_per_hf", "engine_per_ct2", "ceiling_per_ct2")},
            # The spread of the per-round ratio: how far one round's ratio can be from the median here.
            "ours_per_ct2_range": [round(min(p["ours_per_ct2"] for p in per), 3),
                                   round(max(p["ours_per_ct2"] for p in per), 3)],
            "output_tokens": lengths,
            "other_cores_max": max(p["other_cores"] for p in per),
            "equal_lengths": len({json.dumps(v) for v in lengths.values() if v is not None}) == 1,
        }
    itl = [r["inter_token_ms"] for r in rounds if "inter_token_ms" in r]
    if itl:
        p50, p99 = (statistics.median(x[q] for x in itl) for q in ("p50", "p99"))
        out["inter_token_latency_c16"] = {"workload": "inter-token latency, 16 streams", "unit": "ms",
                                          "p50": round(p50, 2), "p99": round(p99, 2),
                                          "p99_per_p50": round(p99 / p50, 2) if p50 >= 0.01 else None}
    return out


def table(summary: dict[str, Any]) -> str:
    lines = ["| workload | ours, through HTTP | CTranslate2 | HF eager | ours / CT2 | its rounds | "
             "ceiling over HTTP / CT2 | ours / HF | our engine in process / CT2 | lengths equal | other cores |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in summary.items():
        if key.startswith("inter_token"):
            lines.append(f"| {r['workload']} | p50 {r['p50']} ms, p99 {r['p99']} ms | | | | | | | | "
                         f"p99/p50 {r['p99_per_p50']} | |")
            continue

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:,.1f}"

        def ratio(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        lines.append(f"| {r['workload']} | {fmt(r['ours'])} {r['unit']} | {fmt(r['ct2'])} | {fmt(r['hf'])} | "
                     f"{ratio(r['ours_per_ct2'])} | {'-'.join(ratio(v) for v in r['ours_per_ct2_range'])} | "
                     f"{ratio(r['ceiling_per_ct2'])} | "
                     f"{ratio(r['ours_per_hf'])} | {ratio(r['engine_per_ct2'])} | "
                     f"{'yes' if r['equal_lengths'] else 'NO'} | "
                     f"{r['other_cores_max']} |")
    return "\n".join(lines)


def cpu_model() -> str:
    """The processor, as far as the machine tells: its name, family and model, and its widest vector
    extension (the ratios move with it: a virtual machine may say only "AMD EPYC", and CTranslate2's int8
    kernels ran slower than its float32 ones on one such machine and faster on another)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    first = text.split("\n\n", 1)[0].splitlines()  # the first processor's block
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first)}
    flags = set(field.get("flags", "").split())
    vectors = next((f for f in ("avx512f", "avx2", "avx", "sse4_2") if f in flags), "none")
    return (f"{field.get('model name', platform.processor())} (family {field.get('cpu family', '?')}, "
            f"model {field.get('model', '?')}, {vectors})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="the dims (and tokenizers) to use")
    parser.add_argument("--ours", choices=("random", "as-is"), default="random",
                        help="random: re-export --artifacts with random weights; as-is: serve --artifacts")
    parser.add_argument("--work", type=Path, default=None, help="cache of the built models (default: a temp folder)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="requests per row, relative")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: " + ", ".join(ROWS))
    shape_options(parser)
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face eager")
    parser.add_argument("--prepare-only", action="store_true", help="build and convert the models, then stop")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "anchor.json")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of both our servers (max_batch_size=64, busy_intra_op_threads=2: the "
                             "SERVE_ variable without its prefix, any case); repeat for more. "
                             "For A/B runs of a setting")
    args = parser.parse_args()
    if bad := [k for k in args.server_setting if "=" not in k]:
        parser.error(f"--server-setting needs NAME=VALUE, not {bad}")
    extra = {name.lower().removeprefix("serve_"): value
             for name, value in (item.split("=", 1) for item in args.server_setting)}
    if "quantization" in extra:
        parser.error("the anchor runs a float32 and an int8 server itself: no --server-setting quantization")
    asked = {r for r in args.rows.split(",") if r}
    if unknown := asked - set(ROWS):
        parser.error(f"unknown rows {sorted(unknown)}")
    if "generator_c16_stream" in asked:  # it reuses the other engines' generator_c16 numbers
        asked.add("generator_c16")
    present = tuple(k for k in KINDS if (args.artifacts / k / "config.json").is_file())
    built = {m.artifact for m in ANCHOR_MODELS.values() if m.build is not None}  # the Llama is built here
    if missing := sorted({row_kind(r) for r in asked} - set(present) - built):
        if args.rows != parser.get_default("rows"):
            parser.error(f"--artifacts {args.artifacts} has no {', '.join(missing)}")
        print(f"no {', '.join(missing)} in {args.artifacts}: skipping its rows", flush=True)
        asked = {r for r in asked if row_kind(r) in present}
    rows = [r for r in ROWS if r in asked]  # the table's order, whatever the order asked
    kinds = tuple(k for k in KINDS if k in {row_kind(r) for r in rows})
    models = [ANCHOR_MODELS[p] for p in sorted(parts_of(rows))]
    digest = hashlib.sha256(json.dumps([dims(args.artifacts / k) for k in present]).encode()).hexdigest()[:12]
    work = args.work or Path(tempfile.gettempdir()) / f"bench-anchor-{digest}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_hf_and_ct2(args.artifacts, work, kinds)
        if args.ours == "random":
            export_random(args.artifacts, work / f"ours-{exporter_digest()}", kinds)
        # Models built here, each served by a server of its own.
        own_servers = {m.server: (m.build(work, args.llama_size), m.artifact) for m in models if m.build is not None}
    if args.prepare_only:
        print(f"models in {work}")
        return
    served = work / f"ours-{exporter_digest()}" if args.ours == "random" else args.artifacts
    shapes = Shapes(args, served)
    ours = Ours(shapes)
    argv = ["--artifacts", str(served), "--work", str(work), "--threads", str(args.threads),
            "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
            "--target-tokens", str(args.target_tokens), "--llama-size", args.llama_size]
    engines = ("engine", "ct2") if args.no_hf else ("engine", "ct2", "hf")
    workers = {(e, m.name): Worker(e, m.name, argv) for e in engines for m in models
               if m.loader(e) is not None}  # no int8 or Llama HF row
    settings = {"max_new_tokens": max(args.new_tokens, args.target_tokens, 256)} | extra
    # The rows' models; the int8 server (for its one row) without the embedder, whose graph is float32 only.
    servers = {"float32": Server(served, args.threads, models=",".join(kinds), **settings)} if kinds else {}
    for name, (folder, artifact) in own_servers.items():
        servers[name] = Server(folder, args.threads, models=artifact, **settings)
    if any(m.server == "int8" for m in models):
        int8_models = ",".join(k for k in kinds if ANCHOR_MODELS[k].int8_graphs)
        servers["int8"] = Server(served, args.threads, quantization="int8", models=int8_models, **settings)
    dimensions = next((m.floor_dimensions(served / m.artifact) for m in models if m.floor_dimensions), 8)
    floor = FloorServer(free_port(), dimensions)
    try:
        with contextlib.ExitStack() as stack:
            for server in servers.values():
                stack.enter_context(server)
            stack.enter_context(floor)
            for worker in workers.values():
                worker.ask({})  # its "ready" line
            checks = {m.name: check_tokens(workers, shapes, m) for m in models if m.check is not None}
            rounds = []
            for i in range(args.rounds):
                print(f"round {i + 1} of {args.rounds}", flush=True)
                rounds.append(measure_round(servers, floor, ours, workers, args.scale, rows))
    finally:  # a server that failed to start leaves the others running otherwise
        for proc in [*(server.proc for server in servers.values()), floor.proc]:
            if proc.poll() is None:
                proc.kill()
    for worker in workers.values():
        worker.close()
    summary = summarize(rounds, rows, shapes)
    result = {
        "command": " ".join(["python -m benchmarks.anchor", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "versions": versions(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "served": str(served),
        "shapes": {"prompt_tokens": len(shapes.prompt), "new_tokens": shapes.new_tokens,
                   "source_tokens": len(shapes.source), "target_tokens": shapes.target_tokens,
                   "text_tokens": len(shapes.text), "embed_tokens": len(shapes.embed_text)},
        "rows": summary,
        **{m.name: m.check.facts(args.llama_size, checks[m.name]) for m in models if m.check is not None},
        "rounds": rounds,
    }
    print()
    print(table(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


def parts_of(rows: list[str]) -> set[str]:
    return {PARTS[row] for row in rows}


def check_tokens(workers: dict[tuple[str, str], Worker], shapes: Shapes, model: AnchorModel[Any]) -> dict[str, Any]:
    """Greedy tokens of ours in process and CTranslate2 on the same prompts (same weights): equal or not."""
    assert model.check is not None
    prompts = shapes.check_prompts
    tokens = {name: workers[name, model.name].ask({"greedy": prompts})["tokens"] for name in ("engine", "ct2")}
    same = [a == b for a, b in zip(tokens["engine"], tokens["ct2"], strict=False)]
    print(f"{model.check.label} greedy tokens, ours vs CTranslate2: {sum(same)} of {len(same)} prompts agree "
          f"(prompt lengths {[len(p) for p in prompts]})", flush=True)
    return {"agree": all(same), "prompts_agreeing": sum(same), "prompts": len(same),
            "prompt_tokens": [len(p) for p in prompts], "tokens": tokens}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("ctranslate2", "onnxruntime", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


if __name__ == "__main__":
    main()
