"""Hugging Face-format checkpoints -> our model classes, through the family records of model/families/
(each family's shape, model/families/shapes.py, builds the model).

A checkpoint folder holds ``config.json``, the weights (``model.safetensors`` or ``pytorch_model.bin``,
read with ``weights_only=True``) and tokenizer files. Each family maps the HF config onto our config's
options (model/network/config.py) and every HF tensor onto one of our parameters; the mapping is checked both
ways: a checkpoint tensor nobody reads, or one of our parameters nobody fills, is an error that names
them. A decoder's ``generation_config.json`` (end tokens, default sampling settings) goes into its config
(model/importing/generation_config.py). torch and safetensors only: ``transformers`` is needed just for slow
tokenizers (model/importing/hf_tokenizer.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model.families import FAMILIES
from model.families.base import CheckpointError
from model.families.shapes import Checkpoint, Imported
from model.families.t5 import task_prefixes
from model.network.embedder import EmbeddingOptions

__all__ = ["CheckpointError", "Imported", "detect_family", "import_checkpoint", "read_hf_config", "read_weights"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


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
    supported = list(FAMILIES)
    if model_type not in supported:
        architectures = hf.get("architectures")
        raise CheckpointError(
            f"unsupported architecture: model_type={model_type!r}, architectures={architectures!r}; "
            f"supported model types: {', '.join(supported)}"
        )
    return str(model_type)


def import_checkpoint(folder: Path, specials: dict[str, int], labels: list[str] | None = None,
                      embedding: EmbeddingOptions | None = None, languages: dict[str, int] | None = None) -> Imported:
    """Build our model from the checkpoint in ``folder``; ``specials`` come from its tokenizer
    (model/importing/hf_tokenizer.py). An encoder with a trained sequence-classification head imports as a
    classifier; without one, as an embedder (``embedding``: how to pool, from a sentence-transformers
    folder; default mean pooling), unless ``labels`` names the classes of a random head to fine-tune."""
    hf = read_hf_config(folder)
    family = FAMILIES[detect_family(hf)]
    imported = family.import_model(Checkpoint(folder, hf, read_weights(folder), specials, labels, embedding, languages))
    imported.notes += [f"task prefix {task}: {prefix!r} (put it before the text)"
                       for task, prefix in task_prefixes(hf).items()]
    return imported
