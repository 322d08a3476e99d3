"""Hugging Face-format checkpoints -> our model classes, through the family records of model/families/
(each family's shape, model/families/shapes.py, builds the model).

A checkpoint folder holds ``config.json``, the weights (``model.safetensors`` or ``pytorch_model.bin``,
read with ``weights_only=True``) and tokenizer files. Each family maps the HF config onto our config's
options (model/network/config.py) and every HF tensor onto one of our parameters; the mapping is checked both
ways: a checkpoint tensor nobody reads, or one of our parameters nobody fills, is an error that names
them. A decoder's ``generation_config.json`` (end tokens, default sampling settings) goes into its config
(model/importing/generation_config.py). Before any of it, config.json's sizes are checked against the shapes
the weights hold (model/families/dims.py): a wrong one is an error naming the field, never a model of the
wrong size. torch and safetensors only: ``transformers`` is needed just for slow tokenizers
(model/importing/hf_tokenizer.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model.families import FAMILIES
from model.families.base import CheckpointError, strip_prefix
from model.families.dims import Shapes, check_config
from model.families.shapes import Checkpoint, Family, Imported
from model.families.t5 import task_prefixes
from model.network.embedder import EmbeddingOptions

__all__ = ["CheckpointError", "Imported", "checked_config", "detect_family", "import_checkpoint", "read_hf_config",
           "read_weights", "weight_shapes"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


# --- reading the folder ---------------------------------------------------------------------------------


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json (found: {sorted(p.name for p in folder.iterdir())})")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: a JSON object is required, found {type(config).__name__}")
    return config


def weights_file(folder: Path) -> Path:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise CheckpointError(
        f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)} "
        f"(found: {sorted(p.name for p in folder.iterdir())})"
    )


def weight_shapes(folder: Path) -> Shapes:
    """Every tensor's shape, read without loading the weights (safetensors' header; pytorch_model.bin onto the
    meta device)."""
    path = weights_file(folder)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as file:
                names: list[str] = file.keys()  # safe_open is no mapping: keys() is its listing
                return {name: tuple(file.get_slice(name).get_shape()) for name in names}
        tensors = torch.load(path, map_location="meta", weights_only=True)
        return {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    except Exception as exc:  # a truncated or foreign file: safetensors, pickle and zip errors alike
        why = (str(exc).strip().splitlines() or [""])[0][:200]  # one line: torch's messages run to paragraphs
        raise CheckpointError(f"{path}: unreadable weights ({type(exc).__name__}: {why})") from None


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors, as float32 (pytorch_model.bin is unpickled with weights_only=True)."""
    path = weights_file(folder)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
    else:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


# --- one entry point --------------------------------------------------------------------------------------

def detect_family(hf: dict[str, Any]) -> str:
    model_type = hf.get("model_type")
    supported = list(FAMILIES)
    if model_type not in supported:
        architectures = hf.get("architectures")
        raise CheckpointError(
            f"unsupported architecture: model_type={model_type!r}, architectures={architectures!r}; "
            f"supported model types: {', '.join(supported)}"
        )
    return str(model_type)


def checked_config(folder: Path) -> tuple[dict[str, Any], Family, list[str]]:
    """config.json, its family and the notes on it, its sizes checked against the weights' shapes (before any
    model is built: model/families/dims.py); a computed position limit past the cap comes back lowered."""
    hf = read_hf_config(folder)
    family = FAMILIES[detect_family(hf)]
    shapes = strip_prefix(weight_shapes(folder), family.prefix)
    checked, notes = check_config(family.dims, hf, shapes, f"{folder}/config.json")
    return checked, family, notes


def import_checkpoint(folder: Path, specials: dict[str, int], labels: list[str] | None = None,
                      embedding: EmbeddingOptions | None = None, languages: dict[str, int] | None = None) -> Imported:
    """Build our model from the checkpoint in ``folder``; ``specials`` come from its tokenizer
    (model/importing/hf_tokenizer.py). An encoder with a trained sequence-classification head imports as a
    classifier; without one, as an embedder (``embedding``: how to pool, from a sentence-transformers
    folder; default mean pooling), unless ``labels`` names the classes of a random head to fine-tune."""
    hf, family, notes = checked_config(folder)
    imported = family.import_model(Checkpoint(folder, hf, read_weights(folder), specials, labels, embedding, languages))
    imported.notes += notes
    imported.notes += [f"task prefix {task}: {prefix!r} (put it before the text)"
                       for task, prefix in task_prefixes(hf).items()]
    return imported
