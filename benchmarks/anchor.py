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
import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from benchmarks.anchor_engines import (
    ANCHOR_MODELS,
    KINDS,
    ROWS,
    AnchorModel,
    build_hf_and_ct2,
    export_random,
    parts_of,
    row_kind,
)
from benchmarks.anchor_measure import Ours, Worker, check_tokens, measure_round
from benchmarks.anchor_references import exporter_digest
from benchmarks.anchor_report import cpu_model, summarize, table, versions
from benchmarks.anchor_shapes import Shapes, dims, shape_options
from benchmarks.http_floor import FloorServer
from benchmarks.server_process import Server, free_port

REPO = Path(__file__).resolve().parent.parent


def options() -> argparse.ArgumentParser:
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
    return parser


def server_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """--server-setting NAME=VALUE, by the setting's name (lower case, without SERVE_)."""
    if bad := [k for k in args.server_setting if "=" not in k]:
        parser.error(f"--server-setting needs NAME=VALUE, not {bad}")
    extra = {name.lower().removeprefix("serve_"): value
             for name, value in (item.split("=", 1) for item in args.server_setting)}
    if "quantization" in extra:
        parser.error("the anchor runs a float32 and an int8 server itself: no --server-setting quantization")
    return extra


def present_kinds(artifacts: Path) -> tuple[str, ...]:
    """Our artifacts the rows read that --artifacts has."""
    return tuple(k for k in KINDS if (artifacts / k / "config.json").is_file())


def chosen_rows(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The rows --rows asks for, in the table's order, without those whose model --artifacts lacks (an error
    where --rows named them)."""
    asked = {r for r in args.rows.split(",") if r}
    if unknown := asked - set(ROWS):
        parser.error(f"unknown rows {sorted(unknown)}")
    if "generator_c16_stream" in asked:  # it reuses the other engines' generator_c16 numbers
        asked.add("generator_c16")
    present = present_kinds(args.artifacts)
    built = {m.artifact for m in ANCHOR_MODELS.values() if m.build is not None}  # the Llama is built here
    if missing := sorted({row_kind(r) for r in asked} - set(present) - built):
        if args.rows != parser.get_default("rows"):
            parser.error(f"--artifacts {args.artifacts} has no {', '.join(missing)}")
        print(f"no {', '.join(missing)} in {args.artifacts}: skipping its rows", flush=True)
        asked = {r for r in asked if row_kind(r) in present}
    return [r for r in ROWS if r in asked]  # the table's order, whatever the order asked


def prepare(
    args: argparse.Namespace, kinds: tuple[str, ...], models: list[AnchorModel[Any]]
) -> tuple[Path, dict[str, tuple[Path, str]]]:
    """Builds (or finds cached) every model the rows run on: the work folder, and the servers of the models
    built here (each served by a server of its own: its name -> (the folder it serves, its artifact))."""
    present = present_kinds(args.artifacts)
    digest = hashlib.sha256(json.dumps([dims(args.artifacts / k) for k in present]).encode()).hexdigest()[:12]
    work = args.work or Path(tempfile.gettempdir()) / f"bench-anchor-{digest}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_hf_and_ct2(args.artifacts, work, kinds)
        if args.ours == "random":
            export_random(args.artifacts, work / f"ours-{exporter_digest()}", kinds)
        own_servers = {m.server: (m.build(work, args.llama_size), m.artifact) for m in models if m.build is not None}
    return work, own_servers


def start_workers(
    args: argparse.Namespace, served: Path, work: Path, models: list[AnchorModel[Any]]
) -> dict[tuple[str, str], Worker]:
    """A process for each (engine, model) the rows run on (no int8 or Llama HF row)."""
    argv = ["--artifacts", str(served), "--work", str(work), "--threads", str(args.threads),
            "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
            "--target-tokens", str(args.target_tokens), "--llama-size", args.llama_size]
    engines = ("engine", "ct2") if args.no_hf else ("engine", "ct2", "hf")
    return {(e, m.name): Worker(e, m.name, argv) for e in engines for m in models if m.loader(e) is not None}


def start_servers(
    args: argparse.Namespace, served: Path, kinds: tuple[str, ...], models: list[AnchorModel[Any]],
    own_servers: dict[str, tuple[Path, str]], extra: dict[str, str],
) -> dict[str, Server]:
    """Our servers, by the name the rows' models give (AnchorModel.server)."""
    settings = {"max_new_tokens": max(args.new_tokens, args.target_tokens, 256)} | extra
    # The rows' models; the int8 server (for its one row) without the embedder, whose graph is float32 only.
    servers = {"float32": Server(served, args.threads, models=",".join(kinds), **settings)} if kinds else {}
    for name, (folder, artifact) in own_servers.items():
        servers[name] = Server(folder, args.threads, models=artifact, **settings)
    if any(m.server == "int8" for m in models):
        int8_models = ",".join(k for k in kinds if ANCHOR_MODELS[k].int8_graphs)
        servers["int8"] = Server(served, args.threads, quantization="int8", models=int8_models, **settings)
    return servers


def run_rounds(
    args: argparse.Namespace, servers: dict[str, Server], floor: FloorServer, workers: dict[tuple[str, str], Worker],
    shapes: Shapes, models: list[AnchorModel[Any]], rows: list[str],
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Once every server and worker is up: each model's token check, then --rounds rounds of every row."""
    ours = Ours(shapes)
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
    return checks, rounds


def main() -> None:
    parser = options()
    args = parser.parse_args()
    extra = server_settings(parser, args)
    rows = chosen_rows(parser, args)
    kinds = tuple(k for k in KINDS if k in {row_kind(r) for r in rows})
    models = [ANCHOR_MODELS[p] for p in sorted(parts_of(rows))]
    work, own_servers = prepare(args, kinds, models)
    if args.prepare_only:
        print(f"models in {work}")
        return
    served = work / f"ours-{exporter_digest()}" if args.ours == "random" else args.artifacts
    shapes = Shapes(args, served)
    workers = start_workers(args, served, work, models)
    servers = start_servers(args, served, kinds, models, own_servers, extra)
    dimensions = next((m.floor_dimensions(served / m.artifact) for m in models if m.floor_dimensions), 8)
    floor = FloorServer(free_port(), dimensions)
    checks, rounds = run_rounds(args, servers, floor, workers, shapes, models, rows)
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


if __name__ == "__main__":
    main()
