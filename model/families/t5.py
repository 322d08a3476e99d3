"""T5, T5 v1.1 and Flan-T5 (``T5ForConditionalGeneration``, model_type t5) -> our translator.

Pre-norm layers with T5's RMS LayerNorm (no mean, no bias), no biases anywhere, attention scores without
1/sqrt(d_head), no position vectors but a relative position bias (the first layer's table, used by every layer;
bidirectional in the encoder, causal in the decoder), a ReLU or gated-GELU feed-forward, and a tied LM head that
reads the decoder states times d_model**-0.5 (T5 v1.1 and Flan-T5 read them as they are: config.json's
``tie_word_embeddings: false``, or ``scale_decoder_outputs: false`` where transformers 5 saved it).
Decoding starts from the pad token. The task is said in the text (``translate English to French: ...``); the
checkpoint's own prefixes (``task_specific_params``) are listed on the card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import Tensor

from model.families.base import ACTIVATIONS, CheckpointError, Tensors, config_token_id, output_head, require
from model.families.dims import ConfigDims, Size
from model.families.shapes import Seq2SeqFamily
from model.network.config import TranslatorConfig

NAME = "t5"


def feed_forward(hf: dict[str, Any]) -> tuple[str, bool]:
    """(activation, gated) from ``feed_forward_proj``: "relu" (T5) or "gated-gelu" (T5 v1.1, Flan-T5)."""
    proj = str(hf.get("feed_forward_proj", "relu"))
    gated = proj.startswith("gated-")
    name = proj.removeprefix("gated-")
    name = "gelu_new" if gated and name == "gelu" else name  # transformers maps gated-gelu to gelu_new
    if name not in ACTIVATIONS:
        raise CheckpointError(f"{NAME}: feed_forward_proj={proj!r} is not supported (relu, gated-gelu, gated-silu)")
    return ACTIVATIONS[name], gated


def config(hf: dict[str, Any], specials: dict[str, int]) -> TranslatorConfig:
    require(hf, "is_encoder_decoder", True, NAME)
    heads, d_model = hf["num_heads"], hf["d_model"]
    if hf.get("d_kv", d_model // heads) * heads != d_model:
        raise CheckpointError(f"{NAME}: d_kv={hf['d_kv']} with num_heads={heads} != d_model={d_model} is not "
                              "supported (heads must split d_model)")
    act, gated = feed_forward(hf)
    return TranslatorConfig(
        vocab_size=hf["vocab_size"], d_model=d_model, n_heads=heads, d_ff=hf["d_ff"],
        n_encoder_layers=hf["num_layers"], n_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        dropout=hf.get("dropout_rate", 0.1), max_positions=int(hf.get("n_positions") or 512), activation=act,
        special_tokens=specials, norm_position="pre", norm="rms", layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        bias=False, gated_ff=gated, scale_embeddings=False, scale_attention=False,
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        # transformers 5 saves scale_decoder_outputs (and always ties); older configs say both with tie_word_embeddings
        tie_output=hf.get("tie_word_embeddings", True),
        rescale_output=bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))),
        final_logits_bias=False,
    )


def weights(src: Tensors, c: TranslatorConfig, lm_head: Tensor | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"embed.weight": src.take("shared.weight")}
    own = ("self_attn", "ln_self", "0.SelfAttention", "0.layer_norm")  # ours, our norm, theirs, their norm
    cross = ("cross_attn", "ln_cross", "1.EncDecAttention", "1.layer_norm")
    for side, ours_side, count, attentions in (("encoder", "encoder_layers", c.n_encoder_layers, [own]),
                                               ("decoder", "decoder_layers", c.n_decoder_layers, [own, cross])):
        src.take_alias(f"{side}.embed_tokens.weight", out["embed.weight"])
        rel = "rel_enc" if side == "encoder" else "rel_dec"
        table = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"  # the first layer's, shared
        out[f"{rel}.embedding.weight"] = src.take(table)
        out["ln_enc.weight" if side == "encoder" else "ln_dec.weight"] = src.take(f"{side}.final_layer_norm.weight")
        for i in range(count):
            ours, theirs = f"{ours_side}.{i}", f"{side}.block.{i}.layer"
            for our_attn, our_norm, their_attn, their_norm in attentions:
                for our_proj, their_proj in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
                    out[f"{ours}.{our_attn}.{our_proj}.weight"] = src.take(f"{theirs}.{their_attn}.{their_proj}.weight")
                out[f"{ours}.{our_norm}.weight"] = src.take(f"{theirs}.{their_norm}.weight")
            ff = f"{theirs}.{len(attentions)}"
            out[f"{ours}.ln_ff.weight"] = src.take(f"{ff}.layer_norm.weight")
            if c.gated_ff:
                for our_proj, their_proj in (("gate", "wi_0"), ("up", "wi_1"), ("down", "wo")):
                    out[f"{ours}.ff.{our_proj}.weight"] = src.take(f"{ff}.DenseReluDense.{their_proj}.weight")
            else:
                for our_proj, their_proj in (("fc1", "wi"), ("fc2", "wo")):
                    out[f"{ours}.ff.{our_proj}.weight"] = src.take(f"{ff}.DenseReluDense.{their_proj}.weight")
    output_head(out, c.tie_output, lm_head, "embed.weight", NAME)
    return out


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    unk = tokenizer.token_to_id("<unk>")
    pad = config_token_id(folder, hf, "pad_token_id")
    start = hf.get("decoder_start_token_id")
    return {"pad": pad, "unk": int(unk) if unk is not None else pad,
            "bos": start if isinstance(start, int) else pad, "eos": config_token_id(folder, hf, "eos_token_id")}


def task_prefixes(hf: dict[str, Any]) -> dict[str, str]:
    """The checkpoint's task prefixes (``task_specific_params``: ``translation_en_to_fr`` -> its prefix)."""
    params = hf.get("task_specific_params") or {}
    return {task: p["prefix"] for task, p in params.items() if isinstance(p, dict) and p.get("prefix")}


FEED_FORWARD = tuple(f"encoder.block.0.layer.1.DenseReluDense.{w}.weight" for w in ("wi", "wi_0", "wi_1"))
BUCKETS = tuple(f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
                for side in ("encoder", "decoder"))
# Relative positions: n_positions (512 where absent) is the only source of the limit.
DIMS = ConfigDims(
    hidden="d_model", embedding="shared.weight", heads=("num_heads",), head_dim="d_kv",
    layers=(Size("num_layers", ("encoder.block.{i}.",)),
            Size("num_decoder_layers", ("decoder.block.{i}.",), required=False)),
    sizes=(Size("d_ff", FEED_FORWARD), Size("vocab_size", ("lm_head.weight",)),
           Size("relative_attention_num_buckets", BUCKETS, required=False),
           Size("relative_attention_max_distance", required=False)),
    positions=Size("n_positions", required=False),
)

FAMILY = Seq2SeqFamily(NAME, config, weights, special_tokens, lambda tokenizer: {}, "T5ForConditionalGeneration",
                       DIMS)
