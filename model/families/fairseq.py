"""Marian (``MarianMTModel``, model_type marian: OPUS-MT) and BART (``BartForConditionalGeneration``) -> our
translator: fairseq-style post-LN layers (model/families/base.py ``fairseq_layers``), a shared embedding and an
LM head with ``final_logits_bias``. Marian computes split sinusoidal positions; BART learns them (offset 2) and
normalises its embeddings. Decoding starts from ``decoder_start_token_id`` (Marian's is the pad token).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from model.families.base import (
    CheckpointError,
    Seq2SeqFamily,
    Tensors,
    activation,
    config_token_id,
    fairseq_layers,
    norm,
    require,
)
from model.network.config import TranslatorConfig


def seq2seq_config(hf: dict[str, Any], family: str, specials: dict[str, int]) -> TranslatorConfig:
    for side in ("attention_heads", "ffn_dim"):
        if hf.get(f"encoder_{side}") != hf.get(f"decoder_{side}"):
            raise CheckpointError(f"{family}: encoder_{side} != decoder_{side} is not supported (one set of dims)")
    require(hf, "normalize_before", False, family)
    require(hf, "add_final_layer_norm", False, family)
    require(hf, "share_encoder_decoder_embeddings", True, family)
    marian = family == "marian"
    return TranslatorConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1),
        max_positions=hf["max_position_embeddings"],
        activation=activation(hf, "activation_function", family),
        special_tokens=specials,
        norm_position="post",
        learned_positions=not marian,
        sinusoid_layout="split" if marian else "interleaved",
        position_offset=0 if marian else 2,
        separate_decoder_positions=not marian,
        scale_embeddings=bool(hf.get("scale_embedding", marian)),
        embedding_layer_norm=not marian,
        tie_output=hf.get("tie_word_embeddings", True),
        final_logits_bias=True,
        layer_norm_eps=1e-5,
    )


def seq2seq_weights(
    src: Tensors, c: TranslatorConfig, family: str, lm_head: Tensor | None, final_logits_bias: Tensor | None
) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"embed.weight": src.take("shared.weight")}
    for side in ("encoder", "decoder"):
        src.take_alias(f"{side}.embed_tokens.weight", out["embed.weight"])
    if family == "bart":
        out["pos.table.weight"] = src.take("encoder.embed_positions.weight")
        out["pos_dec.table.weight"] = src.take("decoder.embed_positions.weight")
        norm(out, "ln_emb_enc", src, "encoder.layernorm_embedding")
        norm(out, "ln_emb_dec", src, "decoder.layernorm_embedding")
    else:  # Marian's sinusoids are computed, not learned; a saved copy must be the table we compute
        from model.network.layers import sinusoidal_table

        table = sinusoidal_table(c.max_positions, c.d_model, "split")
        for side in ("encoder", "decoder"):
            name = f"{side}.embed_positions.weight"
            if src.has(name) and not torch.allclose(src.take(name), table, atol=1e-5):
                raise CheckpointError(f"marian: {name} is not the sinusoidal table Marian computes")
    fairseq_layers(out, src, c.n_encoder_layers, c.n_decoder_layers)
    if final_logits_bias is None:
        raise CheckpointError(f"{family}: the checkpoint lacks final_logits_bias")
    out["lm_head.bias"] = final_logits_bias.reshape(-1)
    if not c.tie_output:
        if lm_head is None:
            raise CheckpointError(f"{family}: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
        out["lm_head.weight"] = lm_head
    return out


def special_tokens(folder: Path, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    unk = tokenizer.token_to_id("<unk>")
    pad = config_token_id(folder, hf, "pad_token_id")
    return {
        "pad": pad,
        "unk": int(unk) if unk is not None else pad,
        "bos": config_token_id(folder, hf, "decoder_start_token_id"),
        "eos": config_token_id(folder, hf, "eos_token_id"),
    }


def _final_logits_bias(src: Tensors) -> Tensor | None:
    return src.take("final_logits_bias") if src.has("final_logits_bias") else None


def family(name: str, reference_class: str) -> Seq2SeqFamily:
    return Seq2SeqFamily(
        name,
        config=lambda hf, specials: seq2seq_config(hf, name, specials),
        weights=lambda src, c, lm_head: seq2seq_weights(src, c, name, lm_head, _final_logits_bias(src)),
        special_tokens=special_tokens,
        languages=lambda tokenizer: {},
        reference_class=reference_class,
        generation_config=False,  # their decoding is the server's own (the importer never read theirs)
    )


FAMILIES = (family("marian", "MarianMTModel"), family("bart", "BartForConditionalGeneration"))
