"""Hugging Face-format checkpoints -> our model classes (the encoder and Llama-shaped decoder families of
model/families/, GPT-2, Marian, BART).

A checkpoint folder holds ``config.json``, the weights (``model.safetensors`` or ``pytorch_model.bin``,
read with ``weights_only=True``) and tokenizer files. Each family maps the HF config onto our config's
options (model/config.py) and every HF tensor onto one of our parameters; the mapping is checked both
ways: a checkpoint tensor nobody reads, or one of our parameters nobody fills, is an error that names
them. A decoder's ``generation_config.json`` (end tokens, default sampling settings) goes into its config
(model/generation_config.py). torch and safetensors only: ``transformers`` is needed just for slow tokenizers (model/hf_tokenizer.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from model.classifier import Classifier
from model.config import GeneratorConfig, TransformerConfig, TranslatorConfig
from model.embedder import Embedder, EmbeddingOptions
from model.families import DECODER_FAMILIES, ENCODER_FAMILIES, SEQ2SEQ_FAMILIES
from model.families.base import (
    CheckpointError,
    EncoderFamily,
    Tensors,
    activation,
    fairseq_layers,
    linear,
    norm,
    require,
    strip_prefix,
)
from model.generation_config import apply_generation_config, apply_seq2seq_generation_config
from model.families.t5 import task_prefixes
from model.generator import Generator
from model.translator import Translator
from contract.kinds import FAMILIES

__all__ = ["CheckpointError", "Imported", "detect_family", "import_checkpoint", "read_hf_config", "read_weights"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass
class Imported:
    """An imported model and what the card should say about it."""

    kind: str  # "translator" | "generator" | "classifier" | "embedder"
    family: str  # an HF model_type: a family of model/families, "gpt2", "marian" or "bart"
    model: nn.Module
    hf_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # e.g. a head initialized fresh
    random_head: bool = False  # a classifier whose head was created at random (asked for by name)


# --- reading the folder ---------------------------------------------------------------------------------


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json (found: {sorted(p.name for p in folder.iterdir())})")
    config: dict[str, Any] = json.loads(path.read_text())
    return config


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors, as float32 (pytorch_model.bin is unpickled with weights_only=True)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(
            f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)} "
            f"(found: {sorted(p.name for p in folder.iterdir())})"
        )
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


# --- GPT-2 -> Generator ------------------------------------------------------------------------------------


def gpt2_config(hf: dict[str, Any], specials: dict[str, int]) -> GeneratorConfig:
    for key, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                       ("add_cross_attention", False)):
        require(hf, key, value, "gpt2")
    d = hf["n_embd"]
    return GeneratorConfig(
        vocab_size=hf["vocab_size"], d_model=d, n_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * d,
        n_layers=hf["n_layer"], dropout=hf.get("resid_pdrop", 0.1), max_positions=hf["n_positions"],
        activation=activation(hf, "activation_function", "gpt2"), learned_positions=True, special_tokens=specials,
        norm_position="pre", scale_embeddings=False, layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_output=hf.get("tie_word_embeddings", True),
    )


def gpt2_weights(src: Tensors, c: GeneratorConfig, lm_head: Tensor | None) -> dict[str, Tensor]:
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
    if not c.tie_output:
        if lm_head is None:
            raise CheckpointError("gpt2: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
        out["lm_head.weight"] = lm_head
    return out


# --- Marian and BART -> Translator ---------------------------------------------------------------------------


def seq2seq_config(hf: dict[str, Any], family: str, specials: dict[str, int]) -> TranslatorConfig:
    for side in ("attention_heads", "ffn_dim"):
        if hf.get(f"encoder_{side}") != hf.get(f"decoder_{side}"):
            raise CheckpointError(f"{family}: encoder_{side} != decoder_{side} is not supported (one set of dims)")
    require(hf, "normalize_before", False, family)
    require(hf, "add_final_layer_norm", False, family)
    require(hf, "share_encoder_decoder_embeddings", True, family)
    marian = family == "marian"
    return TranslatorConfig(
        vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"], n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
        activation=activation(hf, "activation_function", family), special_tokens=specials, norm_position="post",
        learned_positions=not marian, sinusoid_layout="split" if marian else "interleaved",
        position_offset=0 if marian else 2, separate_decoder_positions=not marian,
        scale_embeddings=bool(hf.get("scale_embedding", marian)), embedding_layer_norm=not marian,
        tie_output=hf.get("tie_word_embeddings", True), final_logits_bias=True, layer_norm_eps=1e-5,
    )


def seq2seq_weights(src: Tensors, c: TranslatorConfig, family: str, lm_head: Tensor | None,
                    final_logits_bias: Tensor | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"embed.weight": src.take("shared.weight")}
    for side in ("encoder", "decoder"):
        src.take_alias(f"{side}.embed_tokens.weight", out["embed.weight"])
    if family == "bart":
        out["pos.table.weight"] = src.take("encoder.embed_positions.weight")
        out["pos_dec.table.weight"] = src.take("decoder.embed_positions.weight")
        norm(out, "ln_emb_enc", src, "encoder.layernorm_embedding")
        norm(out, "ln_emb_dec", src, "decoder.layernorm_embedding")
    else:  # Marian's sinusoids are computed, not learned; a saved copy must be the table we compute
        from model.layers import sinusoidal_table

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


# --- one entry point --------------------------------------------------------------------------------------

# Our parameters a family's checkpoint never fills: the classifier's pretraining heads are not in the
# exported graph (and are kept at their initialization).
PRETRAINING_ONLY = {"classifier": ("mlm_transform.", "mlm_bias", "nsp_head.")}


def detect_family(hf: dict[str, Any]) -> str:
    model_type = hf.get("model_type")
    supported = [*ENCODER_FAMILIES, *(f for f in FAMILIES if f not in ENCODER_FAMILIES)]
    if model_type not in supported:
        architectures = hf.get("architectures")
        raise CheckpointError(
            f"unsupported architecture: model_type={model_type!r}, architectures={architectures!r}; "
            f"supported model types: {', '.join(supported)}"
        )
    return str(model_type)


def load_checked(model: nn.Module, weights: dict[str, Tensor], kind: str, fresh: tuple[str, ...] = ()) -> None:
    """Load ``weights``; every parameter of ``model`` must be filled, except tied copies, the
    pretraining-only heads and the ``fresh`` prefixes (parts the checkpoint does not have, said in the notes)."""
    state = model.state_dict()
    skip = PRETRAINING_ONLY.get(kind, ()) + fresh
    tied = {"lm_head.weight"} if getattr(model.config, "tie_output", False) else set()
    missing = sorted(k for k in state if k not in weights and k not in tied and not k.startswith(skip))
    unknown = sorted(k for k in weights if k not in state)
    if missing or unknown:
        raise CheckpointError(f"the mapping does not cover our model: missing {missing}, unknown {unknown}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise CheckpointError(f"{name}: checkpoint shape {tuple(tensor.shape)} != ours {tuple(state[name].shape)}")
    model.load_state_dict(weights, strict=False)


def import_checkpoint(folder: Path, specials: dict[str, int], labels: list[str] | None = None,
                      embedding: EmbeddingOptions | None = None, languages: dict[str, int] | None = None) -> Imported:
    """Build our model from the checkpoint in ``folder``; ``specials`` come from its tokenizer
    (model/hf_tokenizer.py). An encoder with a trained sequence-classification head imports as a
    classifier; without one, as an embedder (``embedding``: how to pool, from a sentence-transformers
    folder; default mean pooling), unless ``labels`` names the classes of a random head to fine-tune."""
    hf = read_hf_config(folder)
    family = detect_family(hf)
    raw = read_weights(folder)
    if family in ENCODER_FAMILIES:
        return import_encoder(ENCODER_FAMILIES[family], hf, raw, specials, labels, embedding)
    kind = FAMILIES[family]

    def gpt2() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        head = raw.get("lm_head.weight")
        tensors = strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, "transformer.")
        src = Tensors(tensors)
        c = gpt2_config(hf, specials)
        out = gpt2_weights(src, c, head)
        if c.tie_output and head is not None and not torch.equal(head, out["tok_emb.weight"]):
            raise CheckpointError("gpt2: lm_head.weight should be tied to wte.weight but differs from it")
        return c, Generator(c), out, src

    def seq2seq() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        head, bias = raw.get("lm_head.weight"), raw.get("final_logits_bias")
        rest = {k: v for k, v in raw.items() if k not in ("lm_head.weight", "final_logits_bias")}
        tensors = strip_prefix(rest, "model.")
        src = Tensors(tensors)
        c = seq2seq_config(hf, family, specials)
        out = seq2seq_weights(src, c, family, head, bias)
        if c.tie_output and head is not None and not torch.equal(head, out["embed.weight"]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to the shared embedding but differs")
        return c, Translator(c), out, src

    def decoder() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        spec = DECODER_FAMILIES[family]
        head = raw.get("lm_head.weight")
        src = Tensors(strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, spec.prefix))
        c = spec.config(hf, specials)
        out = spec.weights(src, c, head)
        if c.tie_output and head is not None and not torch.equal(head, out["tok_emb.weight"]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to embed_tokens.weight but differs from it")
        return c, Generator(c), out, src

    def translator() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        spec = SEQ2SEQ_FAMILIES[family]
        head = raw.get("lm_head.weight")
        src = Tensors(strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, "model."))
        c = spec.config(hf, specials)
        c.languages = dict(languages or {})
        apply_seq2seq_generation_config(c, folder, hf)
        out = spec.weights(src, c, head)
        if c.tie_output and head is not None and not torch.equal(head, out["embed.weight"]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to the shared embedding but differs")
        return c, Translator(c), out, src

    builders: dict[str, Callable[[], tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]]] = {
        "gpt2": gpt2, "marian": seq2seq, "bart": seq2seq, **dict.fromkeys(DECODER_FAMILIES, decoder),
        **dict.fromkeys(SEQ2SEQ_FAMILIES, translator)}
    config, model, weights, src = builders[family]()
    if unread := src.unread():
        raise CheckpointError(f"{family}: the checkpoint has tensors the mapping does not use: {unread}")
    if isinstance(config, GeneratorConfig):
        apply_generation_config(config, folder, hf)
    load_checked(model, weights, kind)
    notes = [f"task prefix {task}: {prefix!r} (put it before the text)" for task, prefix in task_prefixes(hf).items()]
    return Imported(kind, family, model.eval(), hf, notes)


def import_encoder(family: EncoderFamily, hf: dict[str, Any], raw: dict[str, Tensor], specials: dict[str, int],
                   labels: list[str] | None, embedding: EmbeddingOptions | None) -> Imported:
    """A BERT-like encoder as a classifier (its trained head, or a random one named by ``labels``) or an embedder."""
    src = Tensors(strip_prefix(raw, family.prefix))
    trained_head = family.has_trained_head(src) and embedding is None
    notes: list[str] = []
    if trained_head:
        names = hf_labels(hf)
    elif labels:
        names = labels
        notes.append(f"WARNING: no trained classification head: a random head for {names} was created; "
                     "its scores mean nothing until it is fine-tuned")
    else:
        names = ["unused"]
    config = family.config(hf, specials, names)
    weights = family.encoder_weights(src, config)
    if trained_head:
        weights |= family.head_weights(src)
    else:
        weights |= family.spare_weights(src)
    if unread := src.unread():
        raise CheckpointError(f"{family.name}: the checkpoint has tensors the mapping does not use: {unread}")
    if trained_head or labels:
        model: nn.Module = Classifier(config)
        fresh = tuple(p for p in ("pooler.", "cls_head.") if not any(k.startswith(p) for k in weights))
        if trained_head and fresh:
            raise CheckpointError(f"{family.name}: the classification head is there but {', '.join(fresh)} is not")
        if "pooler." in fresh:
            notes.append("the checkpoint has no pooler: the pooler is random too")
        load_checked(model, weights, "classifier", fresh)
        return Imported("classifier", family.name, model.eval(), hf, notes, random_head=not trained_head)
    if embedding is None:
        embedding = EmbeddingOptions(pooling="mean", normalize=False)
        notes.append("no trained sequence-classification head: imported as an embedding model with mean pooling, "
                     "not normalised (scripts.import_checkpoint --random-head LABELS creates a random "
                     "classification head to fine-tune instead)")
    limit = min(embedding.max_positions or config.max_positions, config.max_positions)
    embedder = Embedder(config, dataclasses.replace(embedding, max_positions=limit))
    encoder_only = tuple(p for p in ("pooler.", "cls_head.") if not any(k.startswith(p) for k in weights))
    load_checked(embedder.encoder, weights, "classifier", encoder_only)
    return Imported("embedder", family.name, embedder.eval(), hf, notes)


def hf_labels(hf: dict[str, Any]) -> list[str]:
    id2label = hf.get("id2label") or {}
    n = len(id2label) or hf.get("num_labels", 2)
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]
