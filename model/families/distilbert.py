"""DistilBERT: BERT's layout under its own names (dim, hidden_dim, n_layers; q_lin, sa_layer_norm, ffn.lin1),
no token types, learned positions only; the classification head is pre_classifier + ReLU on [CLS], then
classifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import Tensor

from model.families import bert
from model.families.base import CheckpointError, Tensors, activation, linear, norm
from model.families.dims import ConfigDims, Size
from model.families.shapes import EncoderFamily
from model.network.config import ClassifierConfig


def config(hf: dict[str, Any], specials: dict[str, int], labels: list[str]) -> ClassifierConfig:
    if hf.get("sinusoidal_pos_embds", False):
        raise CheckpointError("distilbert: sinusoidal_pos_embds=true is not supported (only learned positions)")
    return ClassifierConfig(
        vocab_size=hf["vocab_size"], d_model=hf["dim"], n_heads=hf["n_heads"], d_ff=hf["hidden_dim"],
        n_layers=hf["n_layers"], dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
        activation=activation(hf, "activation", "distilbert"), learned_positions=True, type_vocab_size=0,
        labels=labels, special_tokens=specials, norm_position="post", scale_embeddings=False,
        embedding_layer_norm=True, layer_norm_eps=1e-12, pooler=True, pooler_activation="relu",
    )


def encoder_weights(src: Tensors, c: ClassifierConfig) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"tok_emb.weight": src.take("embeddings.word_embeddings.weight"),
                              "pos.table.weight": src.take("embeddings.position_embeddings.weight")}
    norm(out, "ln_emb", src, "embeddings.LayerNorm")
    for i in range(c.n_layers):
        ours, theirs = f"layers.{i}", f"transformer.layer.{i}"
        for proj, name in (("q_proj", "q_lin"), ("k_proj", "k_lin"), ("v_proj", "v_lin"), ("out_proj", "out_lin")):
            linear(out, f"{ours}.self_attn.{proj}", src, f"{theirs}.attention.{name}")
        norm(out, f"{ours}.ln_self", src, f"{theirs}.sa_layer_norm")
        linear(out, f"{ours}.ff.fc1", src, f"{theirs}.ffn.lin1")
        linear(out, f"{ours}.ff.fc2", src, f"{theirs}.ffn.lin2")
        norm(out, f"{ours}.ln_ff", src, f"{theirs}.output_layer_norm")
    return out


def head_weights(src: Tensors) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    linear(out, "pooler.0", src, "pre_classifier")
    linear(out, "cls_head", src, "classifier")
    return out


def spare_weights(src: Tensors) -> dict[str, Tensor]:
    return {}  # a base DistilBERT is the encoder alone


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    return bert.special_tokens(folder, hf, tokenizer)  # BERT's WordPiece vocabulary and its special tokens


DIMS = ConfigDims(
    hidden="dim", embedding="embeddings.word_embeddings.weight", heads=("n_heads",),
    layers=(Size("n_layers", ("transformer.layer.{i}.",)),),
    sizes=(Size("hidden_dim", ("transformer.layer.0.ffn.lin1.weight",)),),
    positions=Size("max_position_embeddings", ("embeddings.position_embeddings.weight",)), labels="classifier.weight",
)

FAMILY = EncoderFamily(
    name="distilbert", prefix="distilbert.", config=config, encoder_weights=encoder_weights,
    head_marker="classifier.weight", head_weights=head_weights, spare_weights=spare_weights,
    special_tokens=special_tokens, reference_classes=("DistilBertModel", "DistilBertForSequenceClassification"),
    token_type_input=False, dims=DIMS,
)
