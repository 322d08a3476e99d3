"""Marian (``MarianMTModel``, model_type marian: OPUS-MT) and BART (``BartForConditionalGeneration``) -> our
translator: fairseq-style post-LN layers (model/families/base.py ``fairseq_layers``), a shared embedding and an
LM head with ``final_logits_bias``. Marian computes split sinusoidal positions; BART learns them (offset 2) and
normalises its embeddings. Decoding starts from ``decoder_start_token_id`` (Marian's is the pad token). A Marian
folder without tokenizer.json is converted here (``convert_marian``): transformers has no converter for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, processors
from torch import Tensor

from model.families.base import (
    CheckpointError,
    Tensors,
    activation,
    config_token_id,
    fairseq_layers,
    norm,
    output_head,
    require,
)
from model.families.dims import ConfigDims, Size
from model.families.shapes import Seq2SeqFamily
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
    output_head(out, c.tie_output, lm_head, "embed.weight", family)
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


MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")


def convert_marian(folder: Path) -> Tokenizer:
    from transformers import MarianTokenizer
    from transformers.convert_slow_tokenizer import SpmConverter

    missing = [name for name in MARIAN_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: a Marian tokenizer needs {', '.join(MARIAN_FILES)}; missing {missing}")
    # OPUS-MT's source.spm and target.spm differ, over one shared vocab.json: the tokenizer segments with
    # source.spm (its scores; pieces only the target side has get a floor score, so the source side never
    # picks them) and numbers and decodes every piece of vocab.json, as MarianTokenizer does.
    slow = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"))
    if slow.separate_vocabs:
        raise CheckpointError(f"{folder}: separate source and target vocabularies are not supported")

    class MarianConverter(SpmConverter):
        """SentencePiece segmentation as the library converts it; ids from Marian's vocab.json."""

        def __init__(self, original: Any) -> None:
            original.vocab_file = original.spm_files[0]  # what SpmConverter reads the model from
            SpmConverter.__init__(self, original)

        def vocab(self, proto: Any) -> list[tuple[str, float]]:
            scores = {p.piece: p.score for p in proto.pieces}
            floor = min(scores.values()) - 10.0  # pieces SentencePiece lacks (<pad>, >>xx<<) are never chosen
            by_id = sorted(self.original_tokenizer.encoder.items(), key=lambda item: item[1])
            if [i for _, i in by_id] != list(range(len(by_id))):
                raise CheckpointError(f"{folder}/vocab.json: ids are not 0..{len(by_id) - 1}")
            return [(piece, scores.get(piece, floor)) for piece, _ in by_id]

        def unk_id(self, proto: Any) -> int:
            return int(self.original_tokenizer.encoder[str(self.original_tokenizer.unk_token)])

        def post_processor(self) -> processors.TemplateProcessing:
            eos = str(self.original_tokenizer.eos_token)
            eos_id = self.original_tokenizer.encoder[eos]
            return processors.TemplateProcessing(single=["$A", eos], pair=["$A", "$B", eos],
                                                 special_tokens=[(eos, eos_id)])

    tokenizer = MarianConverter(slow).converted()
    tokenizer.add_special_tokens([str(slow.pad_token), str(slow.eos_token), str(slow.unk_token)])
    tokenizer.add_tokens(slow.supported_language_codes)  # ">>fra<<" target codes stay one token, as in Marian
    return tokenizer


def seq2seq_dims(positions: Size, sizes: tuple[Size, ...] = (), offset_token: str | None = None) -> ConfigDims:
    """The fairseq translators' sizes (Marian, BART, M2M100): one width, encoder and decoder counts apart."""
    return ConfigDims(
        hidden="d_model", embedding="shared.weight", heads=("encoder_attention_heads", "decoder_attention_heads"),
        layers=(Size("encoder_layers", ("encoder.layers.{i}.",)),
                Size("decoder_layers", ("decoder.layers.{i}.",))),
        sizes=(Size("encoder_ffn_dim", ("encoder.layers.0.fc1.weight",)),
               Size("decoder_ffn_dim", ("decoder.layers.0.fc1.weight",)), Size("vocab_size", ("lm_head.weight",)),
               *sizes),
        positions=positions, offset_token=offset_token,
    )


# BART learns its position tables (2 rows before position 0); Marian computes sinusoids (a saved copy bounds them).
TABLES = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")
LOGITS_BIAS = Size("vocab_size", ("final_logits_bias",), axis=1)  # [1, vocab]
DIMS = {"bart": seq2seq_dims(Size("max_position_embeddings", TABLES, extra=2), (LOGITS_BIAS,)),
        "marian": seq2seq_dims(Size("max_position_embeddings", TABLES), (LOGITS_BIAS,))}


def family(name: str, reference_class: str,
           slow_tokenizer: Callable[[Path], Tokenizer] | None = None) -> Seq2SeqFamily:
    return Seq2SeqFamily(
        name,
        config=lambda hf, specials: seq2seq_config(hf, name, specials),
        weights=lambda src, c, lm_head: seq2seq_weights(src, c, name, lm_head, _final_logits_bias(src)),
        special_tokens=special_tokens,
        languages=lambda tokenizer: {},
        reference_name=reference_class,
        dims=DIMS[name],
        generation_config=False,  # their decoding is the server's own (the importer never read theirs)
        slow_tokenizer=slow_tokenizer,
    )


FAMILIES = (family("marian", "MarianMTModel", convert_marian), family("bart", "BartForConditionalGeneration"))
