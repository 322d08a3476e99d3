"""Imported model vs ``transformers`` itself: the same padded batch through both, logits compared.

Used by scripts/import_checkpoint.py (the parity figures in the card) and by tests/model/test_hf_import.py and
tests/model/test_hf_encoders.py.
Needs ``transformers`` (the ``import`` extra); the server never imports this module.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from model.export.graphs import round_weights_to_fp16
from model.families import FAMILIES
from model.families.shapes import empty_cache
from model.network.embedder import pool

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["empty_cache", "fp16_rounded", "hf_embeddings", "hf_logits", "load_hf_model", "max_abs_diff",
           "onnx_logits", "onnx_outputs", "ours_logits", "real_positions", "reference_inputs", "session"]

M = TypeVar("M", bound=nn.Module)

SAMPLE_TEXTS = [
    "A wonderful, moving film with brilliant performances.",
    "Dull.",
    "The plot is thin, but the acting saves it in the end, mostly.",
]


def load_hf_model(folder: Path, family: str, has_head: bool = True) -> PreTrainedModel:
    import transformers

    name = FAMILIES[family].reference_class(has_head)
    model: PreTrainedModel = getattr(transformers, name).from_pretrained(str(folder), attn_implementation="eager")
    model.eval()
    return model


def fp16_rounded(model: M) -> M:
    """A copy with weights rounded as the exporter stores them, so fp16 storage is not counted as a mismatch."""
    rounded = copy.deepcopy(model)
    round_weights_to_fp16(rounded)
    return rounded


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_outputs(artifact: Path, role: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    config = json.loads((artifact / "config.json").read_text())
    sess = session(artifact / config["graphs"][role]["file"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def reference_inputs(family: str, tokenizer: Tokenizer, specials: dict[str, int],
                     texts: list[str]) -> dict[str, Tensor]:
    """One padded batch for the family: classifier/encoder inputs, a left-padded prompt batch, or
    source + a teacher-forced target prefix."""
    return FAMILIES[family].reference_inputs(tokenizer, specials, texts)


@torch.no_grad()
def hf_logits(model: nn.Module, family: str, inputs: dict[str, Tensor]) -> Tensor:
    """The reference's logits (a headless encoder's: its last hidden states)."""
    return FAMILIES[family].reference_output(model, inputs)


@torch.no_grad()
def ours_logits(model: nn.Module, family: str, inputs: dict[str, Tensor], headless: bool = False) -> Tensor:
    """Our model's logits for ``reference_inputs``; ``headless`` (or an embedder): the encoder's hidden states."""
    return FAMILIES[family].our_output(model, inputs, headless)


def onnx_logits(artifact: Path, family: str, inputs: dict[str, Tensor]) -> np.ndarray:
    config = json.loads((artifact / "config.json").read_text())
    return FAMILIES[family].graph_output(lambda role, feeds: onnx_outputs(artifact, role, feeds), config, inputs)


@torch.no_grad()
def hf_embeddings(model: nn.Module, inputs: dict[str, Tensor], pooling: str) -> Tensor:
    """A headless reference's last hidden states pooled as sentence-transformers pools them."""
    return pool(model(**inputs).last_hidden_state, inputs["attention_mask"], pooling)


def real_positions(family: str, inputs: dict[str, Tensor]) -> Tensor:
    """Boolean [B, S] of the positions whose [B, S, ...] outputs count (padding is not compared)."""
    return FAMILIES[family].compared_positions(inputs)


def max_abs_diff(a: Tensor | np.ndarray, b: Tensor | np.ndarray, keep: Tensor | None) -> float:
    a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
    if keep is not None and a.dim() == 3:
        a, b = a[keep], b[keep]
    return float((a - b).abs().max())
