"""RoBERTa: BERT's layers with byte-level BPE (<s> </s> <pad> <unk> <mask>), one token-type row (added to every
token; the graph has no token_type_ids input) and positions that start after the padding id: position i is
row padding_idx + 1 + i, so the table serves max_position_embeddings - padding_idx - 1 positions. Its
classification head reads <s> through classifier.dense + tanh, then classifier.out_proj (no pooler)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import Tensor

from model.families import bert
from model.families.base import CheckpointError, Tensors, linear, named_special_tokens
from model.families.shapes import EncoderFamily
from model.network.config import ClassifierConfig

# BERT's sizes; the table's first rows are the padding offset (counted in max_position_embeddings).
DIMS = dataclasses.replace(bert.DIMS, labels="classifier.out_proj.weight", offset_token="pad_token_id")
SPECIALS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}


def roberta_like_config(hf: dict[str, Any], specials: dict[str, int], labels: list[str],
                        family: str) -> ClassifierConfig:
    pad = hf.get("pad_token_id", 1)
    offset = pad + 1  # the rows in front of position 0 (the padding row and those below it)
    if hf["max_position_embeddings"] <= offset:
        raise CheckpointError(f"{family}: max_position_embeddings={hf['max_position_embeddings']} leaves no positions "
                              f"after the padding offset {offset}")
    config = bert.config({**hf, "max_position_embeddings": hf["max_position_embeddings"] - offset}, specials, labels)
    config.position_offset = offset
    if config.type_vocab_size > 2:
        raise CheckpointError(f"{family}: type_vocab_size={config.type_vocab_size} is not supported (at most 2)")
    return config


def config(hf: dict[str, Any], specials: dict[str, int], labels: list[str]) -> ClassifierConfig:
    return roberta_like_config(hf, specials, labels, "roberta")


def encoder_weights(src: Tensors, c: ClassifierConfig) -> dict[str, Tensor]:
    return bert.encoder_weights(src, c)


def head_weights(src: Tensors) -> dict[str, Tensor]:
    """classifier.dense + tanh on <s> is our pooler; out_proj is our head. A base model's pooler is not used."""
    src.discard("pooler.")
    out: dict[str, Tensor] = {}
    linear(out, "pooler.0", src, "classifier.dense")
    linear(out, "cls_head", src, "classifier.out_proj")
    return out


def spare_weights(src: Tensors) -> dict[str, Tensor]:
    """A base model's pooler: RobertaForSequenceClassification does not use it, and neither does an embedder."""
    src.discard("pooler.")
    return {}


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    return named_special_tokens(folder, tokenizer, SPECIALS)


FAMILY = EncoderFamily(
    name="roberta", prefix="roberta.", config=config, encoder_weights=encoder_weights,
    head_marker="classifier.out_proj.weight", head_weights=head_weights, spare_weights=spare_weights,
    special_tokens=special_tokens, reference_classes=("RobertaModel", "RobertaForSequenceClassification"),
    token_type_input=False, dims=DIMS,
)
