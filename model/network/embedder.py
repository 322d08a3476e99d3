"""Sentence embeddings: a BERT-style encoder (model/network/classifier.py) whose final hidden states are pooled
into one vector per text, the way sentence-transformers' Pooling module does it.

The vector is returned as pooled, not normalised: config.json's ``normalize`` tells the server whether
to L2-normalise by default (sentence-transformers' Normalize module), and a request may ask otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from model.network.classifier import Classifier
from model.network.config import ClassifierConfig

POOLING_MODES = ("mean", "cls", "max", "lasttoken")  # sentence-transformers' names (1_Pooling/config.json)


@dataclass(frozen=True)
class EmbeddingOptions:
    """What config.json says about an embedder beyond its encoder (the server reads these keys)."""

    pooling: str = "mean"
    normalize: bool = True
    max_positions: int | None = None  # the input limit the server enforces (default: the encoder's table)
    dimensions_truncatable: bool = False  # true only for Matryoshka-trained models

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}, got {self.pooling!r}")


def pool(hidden: Tensor, attention_mask: Tensor, mode: str) -> Tensor:
    """[B, S, D] hidden states and the [B, S] mask (1 = real token) -> [B, D] sentence vectors."""
    real = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * real).sum(1) / real.sum(1).clamp(min=1e-9)  # sentence-transformers' clamp
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        # Padding may never win; sentence-transformers fills it with -1e9 the same way.
        return torch.where(real > 0, hidden, torch.full_like(hidden, -1e9)).max(dim=1).values
    if mode == "lasttoken":
        # The last real token of each row, for right padding (sentence-transformers' lasttoken pooling).
        last = (attention_mask.sum(1) - 1).clamp(min=0)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling {mode!r}; choose one of {POOLING_MODES}")


class Embedder(nn.Module):
    """An encoder plus pooling: ``forward`` gives the [B, D] embeddings and the per-layer attention maps."""

    def __init__(self, config: ClassifierConfig, options: EmbeddingOptions = EmbeddingOptions()) -> None:
        super().__init__()
        self.encoder = Classifier(config)
        self.options = options

    @property
    def config(self) -> ClassifierConfig:
        return self.encoder.config

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None,
                attention_mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        hidden, weights = self.encoder.encode(input_ids, token_type_ids, attention_mask)
        return pool(hidden, attention_mask, self.options.pooling), weights

    def graph_parameters(self) -> int:
        """Parameters the embedding graph computes with: the encoder without the pooler and the heads."""
        unused = ("pooler.", "cls_head.", "nsp_head.", "mlm_")
        return sum(p.numel() for n, p in self.encoder.named_parameters() if not n.startswith(unused))

    def artifact_fields(self) -> dict[str, Any]:
        """config.json's embedding keys."""
        o = self.options
        return {
            "pooling": o.pooling,
            "normalize": o.normalize,
            "max_positions": o.max_positions or self.config.max_positions,
            "dimensions_truncatable": o.dimensions_truncatable,
        }
