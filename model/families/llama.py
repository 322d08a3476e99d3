"""Llama-shaped decoders (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``; SmolLM and
TinyLlama are Llama): RMSNorm before each sub-layer, rotary positions with the checkpoint's ``rope_theta``
and ``rope_scaling``, grouped-query attention, a SwiGLU feed-forward, tied or separate output head.

The three differ only in options: Qwen2 has biases on the query/key/value projections, Llama may have
``attention_bias`` and ``mlp_bias``, Mistral and Qwen2 may attend within a sliding window, which is refused
where it would change a result (a window shorter than the context).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from tokenizers import Tokenizer
from torch import Tensor

from model.families.base import CheckpointError, Tensors, activation, linear, output_head
from model.families.dims import ConfigDims, Size
from model.families.shapes import DecoderFamily
from model.network.config import GeneratorConfig
from model.network.rotary import ROPE_TYPES, rope_type


def rope_settings(hf: dict[str, Any], family: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None): from ``rope_theta`` / ``rope_scaling`` (the hub's files) or
    ``rope_parameters`` (transformers 5 writes both in one)."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = rope_type(scaling)
    if kind not in ROPE_TYPES:
        raise CheckpointError(f"{family}: rope_scaling type {kind!r} is not supported "
                              f"(supported: {', '.join(ROPE_TYPES)})")
    factor = (scaling or {}).get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise CheckpointError(f"{family}: partial_rotary_factor={factor!r} is not supported (only 1.0)")
    if kind == "default":
        return theta, None
    return theta, {"rope_type": kind, **{k: v for k, v in (scaling or {}).items() if k not in ("type", "rope_type")}}


def check_sliding_window(hf: dict[str, Any], family: str) -> None:
    """A window shorter than the context changes what a position sees: not built, so refused."""
    window, context = hf.get("sliding_window"), hf["max_position_embeddings"]
    used = {"mistral": window is not None,
            "qwen2": bool(hf.get("use_sliding_window")) or "sliding_attention" in (hf.get("layer_types") or []),
            "llama": False}[family]
    if used and window is not None and window < context:
        raise CheckpointError(f"{family}: sliding-window attention (sliding_window={window} < "
                              f"max_position_embeddings={context}) is not supported")


class Biases(TypedDict):
    qkv_bias: bool
    out_bias: bool
    ff_bias: bool


def biases(hf: dict[str, Any], family: str) -> Biases:
    if family == "qwen2":
        return {"qkv_bias": True, "out_bias": False, "ff_bias": False}
    if family == "mistral":
        return {"qkv_bias": False, "out_bias": False, "ff_bias": False}
    attention = bool(hf.get("attention_bias", False))
    return {"qkv_bias": attention, "out_bias": attention, "ff_bias": bool(hf.get("mlp_bias", False))}


def config(hf: dict[str, Any], specials: dict[str, int], family: str) -> GeneratorConfig:
    check_sliding_window(hf, family)
    heads, d = hf["num_attention_heads"], hf["hidden_size"]
    head_dim = hf.get("head_dim") or d // heads
    if head_dim * heads != d:
        raise CheckpointError(f"{family}: head_dim={head_dim} with hidden_size={d} and num_attention_heads={heads} "
                              "is not supported (only head_dim = hidden_size / num_attention_heads)")
    theta, scaling = rope_settings(hf, family)
    return GeneratorConfig(
        vocab_size=hf["vocab_size"], d_model=d, n_heads=heads, n_kv_heads=hf.get("num_key_value_heads") or heads,
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"], dropout=0.0,
        max_positions=hf["max_position_embeddings"], activation=activation(hf, "hidden_act", family, "silu"),
        special_tokens=specials, norm_position="pre", scale_embeddings=False, bias=False,
        layer_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_output=bool(hf.get("tie_word_embeddings", False)),
        norm="rms", rotary=True, rope_theta=theta, rope_scaling=scaling, gated_ff=True, **biases(hf, family),
    )


def weights(src: Tensors, c: GeneratorConfig, lm_head: Tensor | None, family: str) -> dict[str, Tensor]:
    """Our generator's parameters from the base model's tensors (``model.`` stripped) and the LM head."""
    out: dict[str, Tensor] = {"tok_emb.weight": src.take("embed_tokens.weight")}
    for i in range(c.n_layers):
        ours, theirs = f"blocks.{i}", f"layers.{i}"
        out[f"{ours}.ln_self.weight"] = src.take(f"{theirs}.input_layernorm.weight")
        for proj in ("q_proj", "k_proj", "v_proj"):
            linear(out, f"{ours}.self_attn.{proj}", src, f"{theirs}.self_attn.{proj}")
        linear(out, f"{ours}.self_attn.out_proj", src, f"{theirs}.self_attn.o_proj")
        out[f"{ours}.ln_ff.weight"] = src.take(f"{theirs}.post_attention_layernorm.weight")
        for our_proj, their_proj in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            linear(out, f"{ours}.ff.{our_proj}", src, f"{theirs}.mlp.{their_proj}")
    out["ln_f.weight"] = src.take("norm.weight")
    output_head(out, c.tie_output, lm_head, "tok_emb.weight", family)
    return out


def first_id(value: Any) -> int | None:
    """config.json's ``eos_token_id`` may be a list (Llama 3): its first id."""
    if isinstance(value, list):
        return value[0] if value else None
    return value if isinstance(value, int) else None


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    """pad, bos, eos from config.json; a checkpoint without a pad (most) pads with its end token, and one
    without a bos (Qwen2) states its end token there: neither is ever fed to the model (left padding is masked,
    prompts are encoded by the tokenizer)."""
    eos = first_id(hf.get("eos_token_id"))
    if eos is None:
        raise CheckpointError(f"{folder}/config.json: eos_token_id is required")
    bos, pad = first_id(hf.get("bos_token_id")), first_id(hf.get("pad_token_id"))
    return {"pad": eos if pad is None else pad, "bos": eos if bos is None else bos, "eos": eos}


# Rotary positions: max_position_embeddings is the only source of the limit (model/families/dims.py caps it).
DIMS = ConfigDims(
    hidden="hidden_size", embedding="embed_tokens.weight", heads=("num_attention_heads",),
    layers=(Size("num_hidden_layers", ("layers.{i}.",)),),
    sizes=(Size("intermediate_size", ("layers.0.mlp.gate_proj.weight",)), Size("vocab_size", ("lm_head.weight",))),
    positions=Size("max_position_embeddings"),
    kv_heads=Size("num_key_value_heads", ("layers.0.self_attn.k_proj.weight",), required=False), head_dim="head_dim",
)


def family(name: str, reference: str) -> DecoderFamily:
    return DecoderFamily(name=name, prefix="model.", config=lambda hf, specials: config(hf, specials, name),
                         weights=lambda src, c, lm_head: weights(src, c, lm_head, name),
                         special_tokens=special_tokens, reference_name=reference, dims=DIMS)


FAMILIES = (family("llama", "LlamaForCausalLM"), family("qwen2", "Qwen2ForCausalLM"),
            family("mistral", "MistralForCausalLM"))
