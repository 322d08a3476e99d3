"""A sentence-transformers model folder: which module pools and how (modules.json, 1_Pooling/config.json),
whether a Normalize module follows, and the input limit encode() truncates at (sentence_bert_config.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from model.families.base import CheckpointError
from model.network.embedder import EmbeddingOptions

MODULES_FILE = "modules.json"
POOLING_KEYS = {  # 1_Pooling/config.json flag -> our pooling mode
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
}
UNSUPPORTED_POOLING = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


@dataclass(frozen=True)
class SentenceTransformerFolder:
    transformer_dir: Path  # the Hugging Face model the Transformer module loads
    options: EmbeddingOptions
    modules: tuple[str, ...]  # the module types, in order


def is_sentence_transformer(folder: Path) -> bool:
    return (folder / MODULES_FILE).is_file()


def read_sentence_transformer(folder: Path) -> SentenceTransformerFolder:
    modules = json.loads((folder / MODULES_FILE).read_text())
    types = tuple(str(m["type"]).rsplit(".", 1)[-1] for m in modules)
    by_type = {str(m["type"]).rsplit(".", 1)[-1]: m for m in modules}
    if "Transformer" not in by_type or "Pooling" not in by_type:
        raise CheckpointError(f"{folder}/{MODULES_FILE}: a Transformer and a Pooling module are required, "
                              f"found {types}")
    extra = [t for t in types if t not in ("Transformer", "Pooling", "Normalize")]
    if extra:
        raise CheckpointError(f"{folder}/{MODULES_FILE}: modules {extra} are not supported "
                              "(only Transformer, Pooling, Normalize)")
    pooling = pooling_mode(folder / by_type["Pooling"]["path"] / "config.json")
    transformer_dir = folder / by_type["Transformer"]["path"]
    return SentenceTransformerFolder(
        transformer_dir=transformer_dir,
        options=EmbeddingOptions(pooling=pooling, normalize="Normalize" in by_type,
                                 max_positions=max_seq_length(folder, transformer_dir)),
        modules=types,
    )


def pooling_mode(path: Path) -> str:
    config = json.loads(path.read_text())
    for key in UNSUPPORTED_POOLING:
        if config.get(key):
            raise CheckpointError(f"{path}: {key} is not supported (supported: {', '.join(POOLING_KEYS)})")
    modes = [mode for key, mode in POOLING_KEYS.items() if config.get(key)]
    if len(modes) != 1:
        raise CheckpointError(f"{path}: exactly one pooling mode must be on (one of {', '.join(POOLING_KEYS)}), "
                              f"found {modes or 'none'}")
    return modes[0]


def max_seq_length(folder: Path, transformer_dir: Path) -> int | None:
    """encode()'s truncation length: sentence_bert_config.json's max_seq_length (next to the model or the folder)."""
    for path in (transformer_dir / "sentence_bert_config.json", folder / "sentence_bert_config.json"):
        if path.is_file():
            value = json.loads(path.read_text()).get("max_seq_length")
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise CheckpointError(f"{path}: max_seq_length={value!r} must be a positive integer")
            return value
    return None
