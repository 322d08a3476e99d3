"""What the three recipes share: their arguments, where a stable segment starts, the stable segment or the
cooldown branch, the card's training record, and the card written into the run and its export.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from model.training.card import plot_learning_curve, write_card
from model.training.loop import TrainSettings, TrainState, load_weights, train


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
        last = state.segments[-1]
        settings = replace(settings, minutes=last["minutes"], device=last.get("device", "cpu"))
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
