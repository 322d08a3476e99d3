"""Hugging Face-format checkpoints -> our model classes (the encoder and Llama-shaped decoder families of
model/families/, GPT-2, Marian, BART).

A checkpoint folder holds ``config.json``, the weights (``model.safetensors`` or ``pytorch_model.bin``,
read with ``weights_only=True``) and tokenizer files. Each family maps the HF config onto our config's
options (model/network/config.py) and every HF tensor onto one of our parameters; the mapping is checked both
ways: a checkpoint tensor nobody reads, or one of our parameters nobody fills, is an error that names
them. A decoder's ``generation_config.json`` (end tokens, default sampling settings) goes into its config
(model/importing/generation_config.py). torch and safetensors only: ``transformers`` is needed just for slow tokenizers (model/importing/hf_tokenizer.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from contract.kinds import FAMILIES
from model.families import DECODER_FAMILIES, ENCODER_FAMILIES, SEQ2SEQ_FAMILIES
from model.families.base import (
    CheckpointError,
    EncoderFamily,
    Tensors,
    strip_prefix,
)
from model.families.t5 import task_prefixes
from model.importing.generation_config import apply_generation_config, apply_seq2seq_generation_config
from model.kinds import model_kind
from model.network.classifier import Classifier
from model.network.config import GeneratorConfig, TransformerConfig
from model.network.embedder import Embedder, EmbeddingOptions
from model.network.generator import Generator
from model.network.translator import Translator

__all__ = ["CheckpointError", "Imported", "detect_family", "import_checkpoint", "read_hf_config", "read_weights"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass
class Imported:
    """An imported model and what the card should say about it."""

    kind: str  # "translator" | "generator" | "classifier" | "embedder"
    family: str  # an HF model_type: a family of model/families
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


# --- one entry point --------------------------------------------------------------------------------------

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
    skip = model_kind(kind).pretraining_only + fresh  # those heads never reach the exported graph
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
    (model/importing/hf_tokenizer.py). An encoder with a trained sequence-classification head imports as a
    classifier; without one, as an embedder (``embedding``: how to pool, from a sentence-transformers
    folder; default mean pooling), unless ``labels`` names the classes of a random head to fine-tune."""
    hf = read_hf_config(folder)
    family = detect_family(hf)
    raw = read_weights(folder)
    if family in ENCODER_FAMILIES:
        return import_encoder(ENCODER_FAMILIES[family], hf, raw, specials, labels, embedding)
    kind = FAMILIES[family]

    def decoder() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        spec = DECODER_FAMILIES[family]
        head = raw.get("lm_head.weight")
        src = Tensors(strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, spec.prefix))
        c = spec.config(hf, specials)
        out = spec.weights(src, c, head)
        if c.tie_output and head is not None and not torch.equal(head, out["tok_emb.weight"]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to the token embedding but differs from it")
        return c, Generator(c), out, src

    def translator() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        spec = SEQ2SEQ_FAMILIES[family]
        head = raw.get("lm_head.weight")
        src = Tensors(strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, "model."))
        c = spec.config(hf, specials)
        c.languages = dict(languages or {})
        if spec.generation_config:
            apply_seq2seq_generation_config(c, folder, hf)
        out = spec.weights(src, c, head)
        if c.tie_output and head is not None and not torch.equal(head, out["embed.weight"]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to the shared embedding but differs")
        return c, Translator(c), out, src

    config, model, weights, src = decoder() if family in DECODER_FAMILIES else translator()
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
