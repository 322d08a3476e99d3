"""What `--quantize int8|int4` (model/export/quantize.py) costs our own generator and translator, against fp32.

    python -m benchmarks.quantized_quality [--artifacts artifacts] [--data data] [--threads 2] [--sets valid]
                                           [--limit N] [--out bench_results/quantized_quality.json] [--no-cards]

Each committed artifact is quantized into a temporary folder, then measured as served:
  - generator: perplexity of the validation split (data/generation/valid.txt, windows of its 256 positions from an
    empty cache, each predicting its own next tokens) under its decoder graph;
  - translator: corpus BLEU and chrF of the validation verses (data/translation/valid.jsonl, plus any --sets of
    scripts/evaluate_translation.py) through the server's own /v1/translate, at its default request (4 beams)
    and greedy.
The data is `python -m scripts.prepare_data`'s. Prints a table, writes the JSON and (unless --no-cards) each
model's int8 and int4 figures into its card (card.json metrics "quantized", and card.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort
from tokenizers import Tokenizer

from model.export.quantize import PRECISIONS, quantized_copy
from model.importing.quantized import decoder_nll

MODELS = ("generator", "translator")
ALL = ("fp32", *PRECISIONS)
COMMAND = "python -m benchmarks.quantized_quality"


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def graph_megabytes(folder: Path) -> float:
    config = json.loads((folder / "config.json").read_text())
    sizes: list[int] = [(folder / g["file"]).stat().st_size for g in config["graphs"].values()]
    return round(sum(sizes) / 1e6, 1)


def generator_perplexity(folder: Path, data: Path, threads: int) -> dict[str, Any]:
    from model.tasks.generation import load_stream

    config = json.loads((folder / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stream = load_stream(tokenizer, data / "generation" / "valid.txt", config["special_tokens"]["eos"])
    started = time.perf_counter()
    nll, count = decoder_nll(session(folder / config["graphs"]["decoder"]["file"], threads), config, stream,
                             config["max_positions"])
    return {"valid_perplexity": round(math.exp(nll / count), 3), "tokens": count,
            "seconds": round(time.perf_counter() - started, 1), "graph_mb": graph_megabytes(folder)}


def translator_bleu(root: Path, data: Path, threads: int, sets: tuple[str, ...],
                    limit: int | None) -> dict[str, Any]:
    """BLEU / chrF of each set and decoding through the in-process server on ``root``/translator."""
    from scripts.evaluate_translation import evaluate

    started = time.perf_counter()
    results = asyncio.run(evaluate(root, data / "translation", limit, threads, sets))
    out: dict[str, Any] = {}
    for name, decodings in results.items():
        for decoding, m in decodings.items():
            out |= {f"{name}_{decoding}_bleu": m["bleu"], f"{name}_{decoding}_chrf": m["chrf"]}
        out[f"{name}_sentences"] = next(iter(decodings.values()))["sentences"]
    return out | {"seconds": round(time.perf_counter() - started, 1), "graph_mb": graph_megabytes(root / "translator")}


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, Any]]:
    """{model: {precision: figures}}, every precision of one model before the next."""
    report: dict[str, dict[str, Any]] = {name: {} for name in MODELS}
    for precision in ALL:
        root = tmp / precision
        root.mkdir()
        for name in MODELS:
            if precision == "fp32":
                (root / name).symlink_to((args.artifacts / name).resolve())
            else:
                quantized_copy(args.artifacts / name, root / name, precision)
        report["generator"][precision] = generator_perplexity(root / "generator", args.data, args.threads)
        print(f"generator {precision}: {report['generator'][precision]}", flush=True)
        report["translator"][precision] = translator_bleu(root, args.data, args.threads, args.sets, args.limit)
        print(f"translator {precision}: {report['translator'][precision]}", flush=True)
    return report


def changes(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each quantized precision's quality figures, with their change against fp32 (relative for perplexity,
    points for BLEU and chrF)."""
    out: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS:
        row: dict[str, Any] = {}
        for key, value in figures[precision].items():
            fp32 = figures["fp32"][key]
            if key.endswith("perplexity"):
                row |= {key: value, f"{key}_change": f"{value / fp32 - 1:+.2%}"}
            elif key.endswith(("_bleu", "_chrf")):
                row |= {key: value, f"{key}_change": f"{value - fp32:+.2f}"}
        out[precision] = row
    return out


def write_cards(artifacts: Path, report: dict[str, dict[str, Any]]) -> None:
    """card.json's metrics "quantized" (and card.md, with the writer that made it): the perplexity, and BLEU at
    the server's default request, of each precision and their change against fp32."""
    from scripts.card_examples import write_any_card

    for name, figures in report.items():
        card = json.loads((artifacts / name / "card.json").read_text())
        shown = ("perplexity", "default_bleu")
        card["metrics"]["quantized"] = {
            precision: {k: v for k, v in row.items() if k.removesuffix("_change").endswith(shown)}
            for precision, row in changes(figures).items()} | {"measured_by": COMMAND}
        write_any_card(artifacts / name, card)


def print_table(report: dict[str, dict[str, Any]]) -> None:
    print(f"\n| model | measure | {' | '.join(ALL)} |\n|---|---|{'---|' * len(ALL)}")
    for name, figures in report.items():
        for key in figures["fp32"]:
            print(f"| {name} | {key} | {' | '.join(str(figures[p][key]) for p in ALL)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sets", default="valid", help="the translator's sets (scripts/evaluate_translation.py)")
    parser.add_argument("--limit", type=int, default=None, help="the first N pairs of each translation set")
    parser.add_argument("--out", type=Path, default=Path("bench_results/quantized_quality.json"))
    parser.add_argument("--no-cards", action="store_true", help="leave the artifacts' cards as they are")
    args = parser.parse_args()
    args.sets = tuple(args.sets.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        report = measure(args, Path(tmp))
    meta = {"command": f"{COMMAND} --threads {args.threads} --sets {','.join(args.sets)}",
            "onnxruntime": ort.__version__, "threads": args.threads}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, **report,
                                    "changes": {n: changes(f) for n, f in report.items()}}, indent=2) + "\n")
    print_table(report)
    if not args.no_cards:
        write_cards(args.artifacts, report)


if __name__ == "__main__":
    main()
