"""Tiny randomly initialized models and their artifacts, for fast service and export tests (and for
trying the server without trained models: ``python -m scripts.export --tiny --out /tmp/tiny``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from model.config import ClassifierConfig, GeneratorConfig, TransformerConfig, TranslatorConfig
from model.export import MODEL_CLASSES, export_model
from service.contract.kinds import KINDS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TINY_CORPUS = [
    "In the beginning God created the heavens and the earth.",
    "Au commencement, Dieu créa les cieux et la terre.",
    "The movie was wonderful, a delight from start to finish.",
    "Le film était très ennuyeux ; où est l'élève ? Déjà à la crèche, naïf garçon « bien sûr ».",
    "A dull, tedious and predictable story with no heart.",
    "Fellow citizens, the state of the union is strong. Café, piñata, 東京, 🙂!",
]


def tiny_config(kind: str, vocab_size: int, special_tokens: dict[str, int]) -> TransformerConfig:
    common = dict(vocab_size=vocab_size, d_model=32, n_heads=2, d_ff=64, max_positions=128, special_tokens=special_tokens)
    if kind == "translator":
        return TranslatorConfig(**common, n_encoder_layers=2, n_decoder_layers=2)
    if kind == "generator":
        return GeneratorConfig(**common, n_layers=2)
    return ClassifierConfig(**common, n_layers=2)


def build_tiny_model(kind: str) -> tuple[nn.Module, Tokenizer]:
    """A tiny randomly initialized model and its tokenizer; deterministic (seed 0)."""
    from model import tokenization

    torch.manual_seed(0)
    tokenizer = tokenization.TRAINERS[kind](TINY_CORPUS * 4, 300)
    config = tiny_config(kind, tokenizer.get_vocab_size(), tokenization.SPECIAL_TOKENS[kind])
    return MODEL_CLASSES[kind](config), tokenizer  # type: ignore[call-arg]


def export_tiny_artifacts(out_dir: Path, kinds: tuple[str, ...] = tuple(KINDS)) -> None:
    """Tiny models with real (tiny) tokenizers in ``out_dir/<kind>/``.

    The PyTorch reference of each is ``build_tiny_model(kind)`` with ``round_weights_to_fp16`` applied.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        model, tokenizer = build_tiny_model(kind)
        tokenizer_path = out_dir / f"{kind}.tokenizer.json"
        tokenizer.save(str(tokenizer_path))
        export_model(kind, model, tokenizer_path, out_dir / kind)
        tokenizer_path.unlink()
