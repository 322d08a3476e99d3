"""M2M100 and NLLB-200 (``M2M100ForConditionalGeneration``, model_type m2m_100) -> our translator.

Pre-LN layers with a final LayerNorm on each side, token embeddings scaled by sqrt(d_model), fairseq's sinusoidal
positions starting after the padding id (position p is row pad + 1 + p), a tied LM head without a bias. The
target language is the first generated token (forced); the source starts with its language token. Language codes
are the tokenizer's added tokens in either style: M2M100's ``__fr__`` (served as ``fr``) and NLLB's ``fra_Latn``.
"""

from __future__ import annotations

import re
from typing import Any

from tokenizers import Tokenizer
from torch import Tensor

from model.families.base import CheckpointError, Tensors, activation, fairseq_layers, norm, output_head, require
from model.families.dims import Size
from model.families.fairseq import seq2seq_dims, special_tokens  # the fairseq translators' ids: pad, unk, start, end
from model.families.shapes import Seq2SeqFamily
from model.network.config import TranslatorConfig

NAME = "m2m_100"
LANGUAGE_TOKEN = re.compile(r"^__([a-z]{2,3}(?:_[A-Za-z]+)?)__$|^([a-z]{3}_[A-Z][a-z]{3})$")


def config(hf: dict[str, Any], specials: dict[str, int]) -> TranslatorConfig:
    for side in ("attention_heads", "ffn_dim"):
        if hf.get(f"encoder_{side}") != hf.get(f"decoder_{side}"):
            raise CheckpointError(f"{NAME}: encoder_{side} != decoder_{side} is not supported (one set of dims)")
    require(hf, "tie_word_embeddings", True, NAME)
    pad = hf["pad_token_id"]
    return TranslatorConfig(
        vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"], n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
        activation=activation(hf, "activation_function", NAME), special_tokens=specials, norm_position="pre",
        learned_positions=False, sinusoid_layout="fairseq", position_offset=pad + 1,
        scale_embeddings=bool(hf.get("scale_embedding", True)), embedding_layer_norm=False, tie_output=True,
        final_logits_bias=False, layer_norm_eps=1e-5,
    )


def weights(src: Tensors, c: TranslatorConfig, lm_head: Tensor | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"embed.weight": src.take("shared.weight")}
    for side in ("encoder", "decoder"):
        src.take_alias(f"{side}.embed_tokens.weight", out["embed.weight"])
        src.discard(f"{side}.embed_positions.")  # computed, never learned (a non-persistent buffer)
        norm(out, "ln_enc" if side == "encoder" else "ln_dec", src, f"{side}.layer_norm")
    fairseq_layers(out, src, c.n_encoder_layers, c.n_decoder_layers)
    output_head(out, True, lm_head, "embed.weight", NAME)
    return out


def languages(tokenizer: Tokenizer) -> dict[str, int]:
    """The tokenizer's language tokens by code: ``__fr__`` -> ``fr``, ``fra_Latn`` as it is."""
    found: dict[str, int] = {}
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        match = LANGUAGE_TOKEN.match(added.content)
        if match:
            found[match.group(1) or match.group(2)] = int(token_id)
    return dict(sorted(found.items()))


# Sinusoids computed after the padding id (a saved copy is a buffer the mapping discards): the limit is config.json's.
DIMS = seq2seq_dims(Size("max_position_embeddings"), offset_token="pad_token_id")

FAMILY = Seq2SeqFamily(NAME, config, weights, special_tokens, languages, "M2M100ForConditionalGeneration", DIMS)
