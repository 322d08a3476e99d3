"""Load a trained run folder (runs/<model>/) and hand it to the exporter."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from model.config import load_config
from model.export import MODEL_CLASSES, export_model
from model.training import load_weights


def load_trained(kind: str, run_dir: Path, weights: str = "best") -> nn.Module:
    config = load_config(run_dir / "config.json")
    model = MODEL_CLASSES[kind](config)  # type: ignore[call-arg]
    load_weights(model, run_dir / f"{weights}.safetensors")
    return model.eval()


def export_checkpoint(kind: str, run_dir: Path, out_dir: Path, int8: bool = True) -> None:
    """runs/<kind>/ (config.json, best.safetensors, tokenizer.json, card.*) -> artifacts/<kind>/."""
    model = load_trained(kind, run_dir)
    export_model(kind, model, run_dir / "tokenizer.json", out_dir, card_dir=run_dir, int8=int8)
