"""Tiny randomly initialized models and their artifacts, for fast service and export tests (and for
trying the server without trained models: ``python -m scripts.export --tiny --out /tmp/tiny``).

Beside the trainable kinds (contract.kinds.KINDS) come two encoder artifacts that are not kinds
of their own: ``embedder`` (the embedding task: BERT-like, mean pooling, normalize true) and
``reranker`` (a cross-encoder: a classification artifact with one label, "score", whose logit is the
relevance of a (query, text) pair).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from contract.kinds import KINDS
from model.export.graphs import export_model
from model.kinds import model_kind
from model.network.classifier import Classifier
from model.network.config import ClassifierConfig, TransformerConfig
from model.network.embedder import Embedder, EmbeddingOptions

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
    common: dict[str, Any] = {"vocab_size": vocab_size, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_positions": 128,
                              "special_tokens": special_tokens}
    config = model_kind(kind).config
    assert config is not None, f"{kind} is not trained here"
    common.update(dict.fromkeys(config.depth_fields, 2))
    return config(**common)


def build_tiny_model(kind: str) -> tuple[nn.Module, Tokenizer]:
    """A tiny randomly initialized model and its tokenizer; deterministic (seed 0)."""

    torch.manual_seed(0)
    from model.kinds import model_kind

    record = model_kind(kind)
    assert record.train_tokenizer is not None and record.special_tokens is not None, f"{kind} is not trained here"
    tokenizer = record.train_tokenizer(TINY_CORPUS * 4, 300)
    config = tiny_config(kind, tokenizer.get_vocab_size(), record.special_tokens)
    return record.build(config), tokenizer


RERANKER_LABEL = "score"  # the reranker's one label: its logit is the relevance score
TINY_ENCODERS = ("embedder", "reranker")  # tiny artifacts beside the kinds (folder name = served name)
TINY_MAX_POSITIONS = 64  # the tiny embedder's input limit (config.json max_positions), below its table's 128


def build_tiny_encoder(name: str) -> tuple[nn.Module, Tokenizer, str]:
    """A tiny embedder or reranker, its tokenizer (the classifier's) and the kind it exports as; deterministic."""
    from model.training import tokenization

    torch.manual_seed(1 if name == "embedder" else 2)
    tokenizer = tokenization.train_classifier_tokenizer(TINY_CORPUS * 4, 300)
    specials = tokenization.CLASSIFIER_IDS
    if name == "embedder":
        config = ClassifierConfig(**_tiny_sizes(tokenizer.get_vocab_size(), specials), n_layers=2)
        options = EmbeddingOptions(pooling="mean", normalize=True, max_positions=TINY_MAX_POSITIONS)
        return Embedder(config, options), tokenizer, "embedder"
    if name == "reranker":
        config = ClassifierConfig(**_tiny_sizes(tokenizer.get_vocab_size(), specials), n_layers=2,
                                  labels=[RERANKER_LABEL])
        return Classifier(config), tokenizer, "classifier"
    raise ValueError(f"no tiny encoder {name!r}; choose one of {TINY_ENCODERS}")


def _tiny_sizes(vocab_size: int, special_tokens: dict[str, int]) -> dict[str, Any]:
    return {"vocab_size": vocab_size, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_positions": 128,
                "special_tokens": special_tokens}


def build_tiny(name: str) -> tuple[nn.Module, Tokenizer, str]:
    """Any tiny artifact's model, tokenizer and export kind: a kind of KINDS or one of TINY_ENCODERS."""
    if name in TINY_ENCODERS:
        return build_tiny_encoder(name)
    model, tokenizer = build_tiny_model(name)
    return model, tokenizer, name


def export_tiny_artifacts(
    out_dir: Path, kinds: tuple[str, ...] = tuple(KINDS), in_place_cache: bool = False
) -> None:
    """Tiny models with real (tiny) tokenizers in ``out_dir/<name>/``: any of KINDS and TINY_ENCODERS
    (``in_place_cache``: the generator's graph writes its cache in place, as an imported decoder's does).

    The PyTorch reference of each is ``build_tiny(name)[0]`` with ``round_weights_to_fp16`` applied.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in kinds:
        model, tokenizer, kind = build_tiny(name)
        tokenizer_path = out_dir / f"{name}.tokenizer.json"
        tokenizer.save(str(tokenizer_path))
        export_model(kind, model, tokenizer_path, out_dir / name, name=name, in_place_cache=in_place_cache)
        tokenizer_path.unlink()
