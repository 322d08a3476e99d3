"""BERT-architecture encoders (BERT, MiniLM): WordPiece, [CLS]/[SEP], two token types, absolute learned
positions; the sequence-classification head is BERT's pooler (dense + tanh on [CLS]) and a linear layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import Tensor

from model.families.base import Tensors, activation, linear, named_special_tokens, norm, require
from model.families.dims import ConfigDims, Size
from model.families.shapes import EncoderFamily
from model.network.config import ClassifierConfig


def config(hf: dict[str, Any], specials: dict[str, int], labels: list[str]) -> ClassifierConfig:
    require(hf, "position_embedding_type", "absolute", "bert")
    require(hf, "is_decoder", False, "bert")
    return ClassifierConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"], dropout=hf.get("hidden_dropout_prob", 0.1),
        max_positions=hf["max_position_embeddings"], activation=activation(hf, "hidden_act", "bert"),
        learned_positions=True, type_vocab_size=hf.get("type_vocab_size", 2), labels=labels,
        special_tokens=specials, norm_position="post", scale_embeddings=False, embedding_layer_norm=True,
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), pooler=True,
    )


def layer_weights(out: dict[str, Tensor], src: Tensors, n_layers: int) -> None:
    """The encoder stack, named as BERT names it (RoBERTa and XLM-RoBERTa use the same names)."""
    for i in range(n_layers):
        ours, theirs = f"layers.{i}", f"encoder.layer.{i}"
        for proj, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            linear(out, f"{ours}.self_attn.{proj}", src, f"{theirs}.attention.self.{name}")
        linear(out, f"{ours}.self_attn.out_proj", src, f"{theirs}.attention.output.dense")
        norm(out, f"{ours}.ln_self", src, f"{theirs}.attention.output.LayerNorm")
        linear(out, f"{ours}.ff.fc1", src, f"{theirs}.intermediate.dense")
        linear(out, f"{ours}.ff.fc2", src, f"{theirs}.output.dense")
        norm(out, f"{ours}.ln_ff", src, f"{theirs}.output.LayerNorm")


def embedding_weights(out: dict[str, Tensor], src: Tensors) -> None:
    out["tok_emb.weight"] = src.take("embeddings.word_embeddings.weight")
    out["seg_emb.weight"] = src.take("embeddings.token_type_embeddings.weight")
    out["pos.table.weight"] = src.take("embeddings.position_embeddings.weight")
    norm(out, "ln_emb", src, "embeddings.LayerNorm")


def encoder_weights(src: Tensors, c: ClassifierConfig) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    embedding_weights(out, src)
    layer_weights(out, src, c.n_layers)
    return out


def pooler_weights(src: Tensors) -> dict[str, Tensor]:
    """BERT's pooler, which a base checkpoint carries and the classification head reads."""
    out: dict[str, Tensor] = {}
    if src.has("pooler.dense.weight"):
        linear(out, "pooler.0", src, "pooler.dense")
    return out


def head_weights(src: Tensors) -> dict[str, Tensor]:
    out = pooler_weights(src)
    linear(out, "cls_head", src, "classifier")
    return out


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    return named_special_tokens(folder, tokenizer, {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]",
                                                    "mask": "[MASK]"})


DIMS = ConfigDims(
    hidden="hidden_size", embedding="embeddings.word_embeddings.weight", heads=("num_attention_heads",),
    layers=(Size("num_hidden_layers", ("encoder.layer.{i}.",)),),
    sizes=(Size("intermediate_size", ("encoder.layer.0.intermediate.dense.weight",)),
           Size("type_vocab_size", ("embeddings.token_type_embeddings.weight",), required=False)),
    positions=Size("max_position_embeddings", ("embeddings.position_embeddings.weight",)),
    labels="classifier.weight",
)

FAMILY = EncoderFamily(
    name="bert", prefix="bert.", config=config, encoder_weights=encoder_weights, head_marker="classifier.weight",
    head_weights=head_weights, spare_weights=pooler_weights, special_tokens=special_tokens,
    reference_classes=("BertModel", "BertForSequenceClassification"), token_type_input=True, dims=DIMS,
)
