"""Training across sessions: the warmup-stable-decay schedule, segments, and weights recovered from artifacts."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the training extra; .ci/run installs it
import torch

from model.export import graphs as export
from model.export.graphs import export_model, round_weights_to_fp16
from model.export.tiny import build_tiny_model
from model.kinds import MODEL_KINDS
from model.training.checkpoint import weights_from_artifact
from model.training.loop import TrainSettings, TrainState, learning_rate, train
from scripts.evaluate_translation import has_repeat_loop


def test_wsd_rate_warms_up_then_stays_constant() -> None:
    s = TrainSettings(lr=1e-3, warmup_steps=10, schedule="wsd", minutes=1)
    assert learning_rate(s, 0, 0.0) == pytest.approx(1e-4)
    assert learning_rate(s, 9, 1.0) == pytest.approx(1e-3)
    # No end: the rate is the same however long the segment has run, even past its budget.
    assert learning_rate(s, 10_000, 3600.0) == pytest.approx(1e-3)


def test_a_fresh_optimizer_warms_the_rate_up_again_and_a_resumed_one_does_not(tmp_path: Path) -> None:
    s = TrainSettings(lr=1e-3, warmup_steps=10, schedule="wsd", minutes=1)
    assert learning_rate(s, 5000, 0.0, warm_from=5000) == pytest.approx(1e-4)  # counted from the segment's start
    assert learning_rate(s, 5009, 1.0, warm_from=5000) == pytest.approx(1e-3)
    settings = TrainSettings(lr=1e-2, warmup_steps=4, schedule="wsd", max_steps=8, eval_every=1)
    train(Linear(), CountingTask(), tmp_path / "run", settings)
    settings.max_steps = 10
    resumed = train(Linear(), CountingTask(), tmp_path / "run", settings)  # optimizer state kept: full rate
    assert [h["lr"] for h in resumed.history[-2:]] == pytest.approx([1e-2, 1e-2])
    carried = TrainState(step=100, elapsed_s=60.0)  # weights from elsewhere (an artifact): a fresh optimizer
    settings.max_steps = 102
    fresh = train(Linear(), CountingTask(), tmp_path / "fresh", settings, start=carried, origin="an artifact")
    assert [h["lr"] for h in fresh.history[-2:]] == pytest.approx([2.5e-3, 5e-3])


def test_cooldown_decays_from_the_stable_rate_to_zero_with_1_minus_sqrt_shape() -> None:
    s = TrainSettings(lr=1e-3, warmup_steps=10, schedule="cooldown", minutes=10)
    assert learning_rate(s, 5000, 0.0) == pytest.approx(1e-3)  # no second warm-up
    assert learning_rate(s, 5000, 300.0) == pytest.approx(1e-3 * (1 - math.sqrt(0.5)))
    assert learning_rate(s, 5000, 600.0) == 0.0
    by_steps = TrainSettings(lr=1e-3, warmup_steps=1, schedule="cooldown", minutes=60, max_steps=200)
    # 100 steps were done before the segment: half of the remaining 100 gives the midpoint.
    assert learning_rate(by_steps, 150, 1.0, segment_step=50) == pytest.approx(1e-3 * (1 - math.sqrt(0.5)))


def test_linear_schedule_decays_to_zero_at_the_end_of_the_budget() -> None:
    s = TrainSettings(lr=1e-3, warmup_steps=1, schedule="linear", minutes=10)
    assert learning_rate(s, 100, 300.0) == pytest.approx(5e-4)
    assert learning_rate(s, 100, 600.0) == 0.0


class CountingTask:
    """A regression task that counts its items, enough to drive the loop."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.x = torch.randn(64, 4)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
        self.seeds: list[int] = []  # train_batches' seed, once per segment

    def train_batches(self, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.seeds.append(seed)
        order = torch.Generator().manual_seed(seed)
        while True:
            rows = torch.randperm(len(self.x), generator=order)
            yield self.x[rows], self.y[rows]

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x).squeeze(-1), y), len(y)

    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        with torch.no_grad():
            return {"val_loss": float(self.loss(model, (self.x, self.y))[0])}


class NoConfig:
    def save(self, path: Path) -> None:
        path.write_text("{}")


class Linear(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 1)
        self.config = NoConfig()  # save_checkpoint writes model.config


def test_each_segment_draws_its_own_batch_order(tmp_path: Path) -> None:
    """A resumed segment must not replay the batches the earlier ones began with: one seed each."""
    settings = TrainSettings(lr=1e-2, warmup_steps=1, schedule="wsd", max_steps=4, eval_every=2, seed=7)
    task = CountingTask()
    train(Linear(), task, tmp_path / "run", settings)
    settings.max_steps = 8
    train(Linear(), task, tmp_path / "run", settings)
    carried = TrainState(step=100, segments=[{"origin": "earlier"}] * 3)  # three segments before, elsewhere
    settings.max_steps = 102
    train(Linear(), task, tmp_path / "fresh", settings, start=carried, origin="an artifact")
    assert task.seeds == [7, 8, 10]
    first, second = (next(task.train_batches(seed))[1] for seed in (7, 8))
    assert not torch.equal(first, second)


def test_segments_add_up_across_resumptions(tmp_path: Path) -> None:
    settings = TrainSettings(lr=1e-2, warmup_steps=1, schedule="wsd", max_steps=110, eval_every=5)  # steps in total
    # A card's history keeps no train loss (scripts/recipes/common.py training_record): the loss plot must cope.
    card_history = [{"step": 100, "minutes": 10.0, "val_loss": 1.0, "segment": 0}]
    carried = TrainState(step=100, elapsed_s=600.0, items_seen=6400, history=card_history,
                         segments=[{"origin": "earlier", "steps": 100}])
    state = train(Linear(), CountingTask(), tmp_path / "fresh", settings, start=carried, origin="an artifact")
    assert (state.step, state.items_seen) == (110, 6400 + 10 * 64)
    assert [s["origin"] for s in state.segments[-2:]] == ["earlier", "an artifact"]
    assert state.segments[-1]["steps"] == 10 and state.segments[-1]["start_step"] == 100
    settings.max_steps = 115
    resumed = train(Linear(), CountingTask(), tmp_path / "fresh", settings)
    assert resumed.step == 115 and resumed.segments[-1]["origin"].startswith("resumed")
    assert [h["segment"] for h in resumed.history] == [0, 1, 1, 2]
    assert (tmp_path / "fresh" / "loss.png").stat().st_size > 0


@pytest.mark.parametrize(("kind", "logits_to_keep"),
                         [("translator", True), ("generator", True), ("generator", False), ("classifier", True)])
def test_weights_are_recovered_exactly_from_an_exported_artifact(
    kind: str, logits_to_keep: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From this exporter's artifacts, and from a generator exported before its graph took logits_to_keep
    (the committed one): the reference export follows the artifact's variant."""
    model, tokenizer = build_tiny_model(kind)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    if not logits_to_keep:
        specs = functools.partial(export.generator_specs, logits_to_keep=False)
        monkeypatch.setitem(MODEL_KINDS, kind, dataclasses.replace(MODEL_KINDS[kind], graphs=specs))
    export_model(kind, model, tmp_path / "tokenizer.json", tmp_path / kind, int8=False)
    monkeypatch.undo()
    graphs = json.loads((tmp_path / kind / "config.json").read_text())["graphs"].values()
    names = [i["name"] for graph in graphs for i in graph["inputs"]]
    assert ("logits_to_keep" in names) == (logits_to_keep and kind == "generator")
    round_weights_to_fp16(model)  # what the fp16-stored graph holds
    recovered, unused = weights_from_artifact(kind, tmp_path / kind)
    # Only the classifier's pretraining heads (MLM, NSP) are in no graph.
    assert all(name.startswith(("mlm_", "nsp_")) for name in unused) and (kind == "classifier") == bool(unused)
    expected = dict(model.named_parameters())
    for name, value in recovered.named_parameters():
        if name not in unused:
            assert torch.equal(value, expected[name]), name


def test_repeat_loop_detector() -> None:
    assert has_repeat_loop([5, 7, 7, 7, 9])  # one token three times
    assert has_repeat_loop([1, 2, 3, 4, 2, 3, 4, 2, 3, 4])  # a run of 3, three times
    assert not has_repeat_loop([1, 2, 1, 2, 3, 1, 2])  # twice is not a loop
    assert not has_repeat_loop([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5])  # a run of 5 is not counted


def test_a_run_packed_for_the_gpu_comes_back_resumable(tmp_path: Path) -> None:
    from model.training.packed_run import pack_run, unpack_run

    settings = TrainSettings(lr=1e-2, warmup_steps=1, schedule="wsd", max_steps=5, eval_every=5)
    state = train(Linear(), CountingTask(), tmp_path / "run", settings)
    (tmp_path / "run" / "tokenizer.json").write_text('{"model": "tiny"}')
    pack_run(tmp_path / "run", tmp_path / "packed.safetensors")
    unpack_run(tmp_path / "packed.safetensors", tmp_path / "back")
    assert (tmp_path / "back" / "tokenizer.json").read_text() == '{"model": "tiny"}'
    settings.max_steps = 8
    resumed = train(Linear(), CountingTask(), tmp_path / "back", settings)  # a fresh optimizer, same totals
    assert (resumed.step, len(resumed.segments)) == (8, 2) and resumed.items_seen == state.items_seen + 3 * 64


def test_classifier_pretraining_resumes_from_the_committed_packed_run(tmp_path: Path) -> None:
    from model.training.packed_run import pack_run
    from scripts.recipes.classifier import resume_committed_pretraining
    from scripts.recipes.common import RecipeArgs

    settings = TrainSettings(lr=1e-2, warmup_steps=1, schedule="wsd", max_steps=5, eval_every=5)
    state = train(Linear(), CountingTask(), tmp_path / "earlier", settings)
    (tmp_path / "earlier" / "tokenizer.json").write_text('{"model": "pretrained"}')
    pack_run(tmp_path / "earlier", tmp_path / "artifacts" / "classifier" / "pretrained.safetensors")
    args = RecipeArgs(tmp_path / "data", tmp_path / "runs" / "classifier", 1.0, artifacts_dir=tmp_path / "artifacts")

    origin = resume_committed_pretraining(args)

    assert origin is not None and "pretrained.safetensors" in origin
    assert (args.run_dir / "tokenizer.json").read_text() == '{"model": "pretrained"}'  # the run's own tokenizer
    settings.max_steps = 7
    resumed = train(Linear(), CountingTask(), args.run_dir / "pretrain", settings, origin=origin)
    assert resumed.step == 7 and resumed.items_seen == state.items_seen + 2 * 64
    assert resumed.segments[-1]["origin"] == origin
    assert resume_committed_pretraining(args) is None  # runs/ has the run now: it is resumed as it is


def test_a_committed_stable_run_comes_before_the_graphs_weights(tmp_path: Path) -> None:
    """On a fresh machine the translator resumes its stable run (artifacts/translator/stable.safetensors),
    not the cooled-down weights of its graphs; an existing runs/ folder comes before both."""
    from tokenizers import Tokenizer, models

    from model.training.packed_run import pack_run
    from scripts.recipes.common import RecipeArgs, starting_point

    settings = TrainSettings(lr=1e-2, warmup_steps=1, schedule="wsd", max_steps=5, eval_every=5)
    train(Linear(), CountingTask(), tmp_path / "earlier", settings)
    earlier = Tokenizer(models.WordLevel({"stable": 0, "[UNK]": 1}, unk_token="[UNK]"))
    earlier.save(str(tmp_path / "earlier" / "tokenizer.json"))
    artifact = tmp_path / "artifacts" / "translator"
    pack_run(tmp_path / "earlier", artifact / "stable.safetensors")
    (artifact / "card.json").write_text("{}")  # a card whose graphs would be recovered: not reached
    args = RecipeArgs(tmp_path / "data", tmp_path / "runs" / "translator", 1.0, artifacts_dir=tmp_path / "artifacts")

    start = starting_point(args, "translator")

    assert start.weights is None and start.origin is not None and "stable.safetensors" in start.origin
    assert start.tokenizer.get_vocab() == {"stable": 0, "[UNK]": 1}  # the run's own tokenizer
    settings.max_steps = 7
    resumed = train(Linear(), CountingTask(), args.run_dir, settings, origin=start.origin)
    assert resumed.step == 7 and resumed.segments[-1]["origin"] == start.origin
    assert starting_point(args, "translator").origin is None  # runs/ has the run now: resumed as it is
