"""XLM-RoBERTa: RoBERTa's network and weight names with a multilingual SentencePiece Unigram tokenizer
(tokenizer.json when the checkpoint has one; else sentencepiece.bpe.model, converted by transformers)."""

from __future__ import annotations

from typing import Any

from model.families import roberta
from model.families.shapes import EncoderFamily
from model.network.config import ClassifierConfig


def config(hf: dict[str, Any], specials: dict[str, int], labels: list[str]) -> ClassifierConfig:
    return roberta.roberta_like_config(hf, specials, labels, "xlm-roberta")


FAMILY = EncoderFamily(
    name="xlm-roberta", prefix="roberta.", config=config, encoder_weights=roberta.encoder_weights,
    head_marker="classifier.out_proj.weight", head_weights=roberta.head_weights, spare_weights=roberta.spare_weights,
    special_tokens=roberta.special_tokens,
    reference_classes=("XLMRobertaModel", "XLMRobertaForSequenceClassification"), token_type_input=False,
    dims=roberta.DIMS,
)
