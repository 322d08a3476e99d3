"""GPT-2 (``GPT2LMHeadModel``, model_type gpt2) -> our generator.

Pre-LN blocks with learned positions, a fused query/key/value Conv1D (``c_attn``, [D, 3D]) split into our three
projections, Conv1D weights stored transposed, a final LayerNorm, the output tied to the token embedding unless
the checkpoint says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import Tensor

from model.families.base import Tensors, activation, config_token_id, linear, norm, output_head, require
from model.families.dims import ConfigDims, Size
from model.families.shapes import DecoderFamily
from model.network.config import GeneratorConfig

NAME = "gpt2"


def config(hf: dict[str, Any], specials: dict[str, int]) -> GeneratorConfig:
    for key, value in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        require(hf, key, value, NAME)
    d = hf["n_embd"]
    return GeneratorConfig(
        vocab_size=hf["vocab_size"],
        d_model=d,
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d,
        n_layers=hf["n_layer"],
        dropout=hf.get("resid_pdrop", 0.1),
        max_positions=hf["n_positions"],
        activation=activation(hf, "activation_function", NAME),
        learned_positions=True,
        special_tokens=specials,
        norm_position="pre",
        scale_embeddings=False,
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_output=hf.get("tie_word_embeddings", True),
    )


def weights(src: Tensors, c: GeneratorConfig, lm_head: Tensor | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"tok_emb.weight": src.take("wte.weight"), "pos.table.weight": src.take("wpe.weight")}
    d = c.d_model
    for i in range(c.n_layers):
        ours, theirs = f"blocks.{i}", f"h.{i}"
        norm(out, f"{ours}.ln_self", src, f"{theirs}.ln_1")
        qkv_w, qkv_b = src.take(f"{theirs}.attn.c_attn.weight"), src.take(f"{theirs}.attn.c_attn.bias")  # [D, 3D]
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            out[f"{ours}.self_attn.{proj}.weight"] = qkv_w[:, j * d : (j + 1) * d].T.contiguous()
            out[f"{ours}.self_attn.{proj}.bias"] = qkv_b[j * d : (j + 1) * d]
        linear(out, f"{ours}.self_attn.out_proj", src, f"{theirs}.attn.c_proj", transpose=True)
        norm(out, f"{ours}.ln_ff", src, f"{theirs}.ln_2")
        linear(out, f"{ours}.ff.fc1", src, f"{theirs}.mlp.c_fc", transpose=True)
        linear(out, f"{ours}.ff.fc2", src, f"{theirs}.mlp.c_proj", transpose=True)
    norm(out, "ln_f", src, "ln_f")
    output_head(out, c.tie_output, lm_head, "tok_emb.weight", "gpt2")
    return out


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    """GPT-2 has one end-of-text token, which pads and begins too unless config.json names others."""
    eos = config_token_id(folder, hf, "eos_token_id")
    pad = config_token_id(folder, hf, "pad_token_id", eos) if hf.get("pad_token_id") is not None else eos
    return {"pad": pad, "eos": eos, "bos": config_token_id(folder, hf, "bos_token_id", eos)}


DIMS = ConfigDims(
    hidden="n_embd", embedding="wte.weight", heads=("n_head",), layers=(Size("n_layer", ("h.{i}.",)),),
    sizes=(Size("n_inner", ("h.0.mlp.c_fc.weight",), axis=1, required=False), Size("vocab_size", ("lm_head.weight",))),
    positions=Size("n_positions", ("wpe.weight",)),
)

FAMILY = DecoderFamily(NAME, "transformer.", config, weights, special_tokens, "GPT2LMHeadModel", DIMS)
