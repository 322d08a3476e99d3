"""The training loop shared by the three models: time-budgeted, resumable, logged.

Schedules (``TrainSettings.schedule``):

- ``wsd``, warmup-stable-decay (Hägele et al. 2024): a linear warm-up, then a constant rate for as long
  as anyone keeps training. A run is extended by resuming it with more minutes; nothing restarts. To
  evaluate or export, ``cooldown`` branches a copy off the stable checkpoint and decays it to zero
  ((1 - sqrt) shape) while the stable run stays free to continue.
- ``linear``: warm-up, then linear decay to zero at the end of the budget (fine-tuning runs).

Each call of ``train`` is a segment with its own budget (``minutes``, or ``max_steps`` in total; minutes
are CPU-minutes on the CPU, see ``training_clock``);
everything needed to resume (weights, optimizer, step, elapsed time, history, segments) is saved at
every validation, so a run killed at any point continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn
from tqdm import tqdm

log = logging.getLogger(__name__)


@dataclass
class TrainSettings:
    minutes: float = 30.0  # budget of this segment: CPU-minutes on the CPU, wall minutes on a GPU (training_clock)
    max_steps: int = 10**9  # total steps, over all segments
    lr: float = 1e-3  # peak (the stable rate for wsd; where the decay starts for cooldown)
    warmup_steps: int = 300
    schedule: str = "linear"  # "linear", "wsd" or "cooldown" (see the module docstring)
    device: str = "cpu"  # "cuda" on a lent GPU (scripts/gpu_train.py)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 250  # steps between validation + checkpoint
    seed: int = 0
    # Layer-wise rate decay (Clark et al. 2020; Sun et al. 2019) for fine-tuning a pretrained encoder: the
    # top gets the full rate, each layer below it ``layer_decay`` times the rate of the one above. 1.0: off.
    # The model says where each parameter sits with ``layer_depth(name) -> (depth, top)``.
    layer_decay: float = 1.0


class _SavesConfig(Protocol):
    def save(self, path: Path) -> None: ...


class _Layered(Protocol):
    def layer_depth(self, name: str) -> tuple[int, int]: ...  # (the parameter's layer, the top layer)


ModelT = TypeVar("ModelT", bound=nn.Module)
ModelT_contra = TypeVar("ModelT_contra", bound=nn.Module, contravariant=True)


class Task(Protocol[ModelT_contra]):
    """What the loop needs from a model-specific task."""

    def train_batches(self, seed: int) -> Iterator[Any]:
        """The training batches, in an order drawn from ``seed`` (and only from it)."""

    def loss(self, model: ModelT_contra, batch: Any) -> tuple[Tensor, int]:
        """Mean loss of the batch and the number of items (tokens/examples) it covers."""

    def validate(self, model: ModelT_contra) -> dict[str, float]:
        """Validation metrics; must include "val_loss" (lower is better)."""


@dataclass
class TrainState:
    step: int = 0
    elapsed_s: float = 0.0
    items_seen: int = 0
    best_val_loss: float = math.inf
    history: list[dict[str, float]] = field(default_factory=list)
    # One entry per call of train(): where it started from, its schedule, minutes, steps and items.
    segments: list[dict[str, Any]] = field(default_factory=list)


def learning_rate(
    settings: TrainSettings, step: int, segment_s: float, segment_step: int = 0, warm_from: int = 0
) -> float:
    """The rate for ``step`` (total) at ``segment_s`` seconds / ``segment_step`` steps into this segment.
    The warm-up counts from ``warm_from``: step 0, or the first step of a segment whose optimizer starts
    fresh (resumed weights without their Adam moments)."""
    warmup = min(1.0, (step - warm_from + 1) / settings.warmup_steps)
    if settings.schedule == "wsd":
        return settings.lr * warmup
    progress = segment_s / (settings.minutes * 60)  # whichever budget ends first
    if settings.max_steps < 10**9:
        progress = max(progress, segment_step / max(1, settings.max_steps - (step - segment_step)))
    remaining = max(0.0, 1.0 - progress)
    if settings.schedule == "cooldown":
        return settings.lr * (1.0 - math.sqrt(1.0 - remaining))  # (1 - sqrt): Hägele et al.'s best cooldown shape
    return settings.lr * warmup * remaining


def training_clock(device: str) -> Callable[[], float]:
    """What a segment's minutes count. On the CPU: the process's CPU time (all its threads), so a run
    paused for a benchmark (SIGSTOP) or waiting for a busy core spends none of its budget, and the cards'
    minutes are CPU-minutes. On a GPU the host mostly waits for the device: wall-clock time."""
    return time.process_time if device == "cpu" else time.monotonic


def on_device(batch: Any, model: nn.Module) -> Any:
    """A tensor, or a tuple of them, on the device of ``model``'s weights (a no-op on the CPU)."""
    device = next(model.parameters()).device
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    return type(batch)(t.to(device, non_blocking=True) for t in batch)


def make_optimizer(model: nn.Module, settings: TrainSettings) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases, LayerNorm and embeddings' 1-d parameters. Each group carries an
    ``lr_scale`` (layer-wise decay, 1.0 without it) that the loop multiplies the scheduled rate by."""
    groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        scale = 1.0
        if settings.layer_decay != 1.0:
            depth, top = cast(_Layered, model).layer_depth(name)  # layer decay: a model that has layers
            scale = settings.layer_decay ** (top - depth)
        groups.setdefault((p.dim() >= 2, scale), []).append(p)
    # Decayed group first, then by falling scale: without layer decay, the two groups saved runs resume into.
    order = sorted(groups, key=lambda key: (not key[0], -key[1]))
    param_groups = [{"params": groups[key], "weight_decay": settings.weight_decay if key[0] else 0.0,
                     "lr_scale": key[1]} for key in order]
    return torch.optim.AdamW(param_groups, lr=settings.lr, betas=(0.9, 0.98), eps=1e-9)


def save_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
                    tag: str) -> None:
    """Weights as safetensors (+ config JSON); optimizer and progress in a torch file for resuming."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, str(run_dir / f"{tag}.safetensors"))
    cast(_SavesConfig, model.config).save(run_dir / "config.json")  # every model here has a config
    if tag == "last":
        torch.save({"optimizer": optimizer.state_dict(), "state": asdict(state)}, run_dir / "resume.pt")
        (run_dir / "history.json").write_text(json.dumps(state.history, indent=1))


def load_weights(model: nn.Module, path: Path) -> None:
    missing, unexpected = load_model(model, str(path), strict=False)
    # Tied weights are stored once; anything else missing means a mismatched checkpoint.
    missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")


def plot_history(history: list[dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    trained = [h for h in history if "train_loss" in h]  # entries carried over from a card keep no train loss
    ax.plot([h["step"] for h in trained], [h["train_loss"] for h in trained], label="train loss")
    ax.plot([h["step"] for h in history], [h["val_loss"] for h in history], label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(
    model: ModelT,
    task: Task[ModelT],
    run_dir: Path,
    settings: TrainSettings,
    resume: bool = True,
    on_validate: Callable[[TrainState, dict[str, float]], None] | None = None,
    start: TrainState | None = None,
    origin: str | None = None,
) -> TrainState:
    """Train one segment: until its time budget or max_steps is spent; keeps ``last`` and ``best`` weights.

    Resumes from ``run_dir`` when it holds a checkpoint (and ``resume``); otherwise starts from the
    model as given with a fresh optimizer and ``start`` (the totals carried over from where the
    weights came from, described by ``origin``), or from zero.
    """
    torch.manual_seed(settings.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    to_device(model, settings.device)
    optimizer = make_optimizer(model, settings)
    state, origin, fresh_optimizer = resume_run(run_dir, model, optimizer, start, origin, resume)
    (run_dir / "train_settings.json").write_text(json.dumps(asdict(settings), indent=2))
    segment = new_segment(state, settings, origin)
    model.train()
    # Each segment draws its own order: with one seed for all, every resumed segment replayed the batches
    # the earlier ones began with (the translator's validation loss 2.515 -> 2.603 in the first 200 steps
    # of a resumed segment, its training loss 2.96 -> 2.63 on batches every segment began with).
    batches = task.train_batches(settings.seed + len(state.segments) - 1)
    budget_s = settings.minutes * 60
    running: list[float] = []
    clock = training_clock(settings.device)
    segment_start, first_step, first_items = clock(), state.step, state.items_seen
    # A fresh optimizer (a packed or recovered run) warms the rate up again: at the full stable rate its
    # first updates bumped the translator's validation loss 2.542 -> 2.671 (in a segment that also replayed
    # its predecessors' first batches; see the batch order above).
    warm_from = first_step if fresh_optimizer else 0
    total_before = state.elapsed_s
    bar = tqdm(total=int(budget_s), unit="s", desc=run_dir.name, mininterval=10)
    segment_s = 0.0
    while segment_s < budget_s and state.step < settings.max_steps:
        lr = learning_rate(settings, state.step, segment_s, state.step - first_step, warm_from)
        loss, n_items = update(model, optimizer, task, next(batches), lr, settings.grad_clip)
        state.step += 1
        state.items_seen += n_items
        running.append(loss)
        now = clock() - segment_start
        bar.update(int(now) - int(segment_s))
        segment_s = now
        state.elapsed_s = total_before + segment_s
        last_step = segment_s >= budget_s or state.step >= settings.max_steps
        if state.step % settings.eval_every == 0 or last_step:
            segment.update(minutes=round(segment_s / 60, 2), steps=state.step - first_step,
                           items=state.items_seen - first_items)
            metrics = evaluate(model, optimizer, task, run_dir, state, lr, sum(running) / len(running))
            bar.set_postfix(train=f"{sum(running) / len(running):.3f}", val=f"{metrics['val_loss']:.3f}")
            running.clear()
            if on_validate:
                on_validate(state, metrics)
    bar.close()
    return state


def to_device(model: nn.Module, device: str) -> None:
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 tensor cores for fp32 matrix products (~1e-3 relative)
        torch.backends.cudnn.allow_tf32 = True
    model.to(device)


def resume_run(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, start: TrainState | None,
               origin: str | None, resume: bool) -> tuple[TrainState, str | None, bool]:
    """The run's state, its origin and whether the optimizer starts fresh: ``run_dir``'s checkpoint when it has
    one (and ``resume``), else ``start`` (or zero) with the model's weights as given."""
    if not (resume and (run_dir / "resume.pt").exists()):
        return start or TrainState(), origin, True
    load_weights(model, run_dir / "last.safetensors")
    saved = torch.load(run_dir / "resume.pt", weights_only=False)
    fresh_optimizer = saved["optimizer"] is None  # None: weights brought back from another machine (gpu_train.py)
    if not fresh_optimizer:
        optimizer.load_state_dict(saved["optimizer"])
    state = TrainState(**saved["state"])
    log.info("resumed %s at step %d (%.1f min elapsed)", run_dir, state.step, state.elapsed_s / 60)
    return state, origin or f"resumed {run_dir}", fresh_optimizer


def new_segment(state: TrainState, settings: TrainSettings, origin: str | None) -> dict[str, Any]:
    """This call's entry in ``state.segments``; its minutes, steps and items are updated at each validation."""
    segment: dict[str, Any] = {
        "origin": origin or "scratch", "schedule": settings.schedule, "lr": settings.lr, "device": settings.device,
        "device_name": torch.cuda.get_device_name() if settings.device.startswith("cuda") else None,
        "threads": torch.get_num_threads(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "start_step": state.step, "start_minutes": round(state.elapsed_s / 60, 2), "start_items": state.items_seen,
        "minutes": 0.0, "steps": 0, "items": 0,
    }
    state.segments.append(segment)
    return segment


def update(model: ModelT, optimizer: torch.optim.Optimizer, task: Task[ModelT], batch: Any, lr: float,
           grad_clip: float) -> tuple[float, int]:
    """One optimizer step at rate ``lr`` (times each group's layer-wise scale); the loss and items it covered."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    loss, n_items = task.loss(model, batch)
    optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(loss)  # loss.backward(), which torch leaves unannotated
    nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item(), n_items


def evaluate(model: ModelT, optimizer: torch.optim.Optimizer, task: Task[ModelT], run_dir: Path, state: TrainState,
             lr: float, train_loss: float) -> dict[str, float]:
    """Validate, append the history entry (with the rate and the mean training loss since the last one), keep
    ``best`` and ``last`` and redraw the curve; the task's metrics."""
    model.eval()
    metrics = task.validate(model)
    model.train()
    entry = {"step": state.step, "minutes": round(state.elapsed_s / 60, 2), "lr": lr,
             "train_loss": train_loss, "items_seen": state.items_seen,
             "segment": len(state.segments) - 1, **metrics}
    state.history.append(entry)
    log.info("%s", json.dumps(entry))
    if metrics["val_loss"] < state.best_val_loss:
        state.best_val_loss = metrics["val_loss"]
        save_checkpoint(run_dir, model, optimizer, state, "best")
    save_checkpoint(run_dir, model, optimizer, state, "last")
    plot_history(state.history, run_dir / "loss.png", run_dir.name)
    return metrics
