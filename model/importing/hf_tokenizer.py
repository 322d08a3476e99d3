"""A checkpoint's tokenizer as one ``tokenizer.json`` (HF ``tokenizers``), and its special token ids.

A ``tokenizer.json`` in the folder is used as it is. A checkpoint that ships only a slow tokenizer
(SentencePiece, or vocab files) is converted by ``transformers``' own converters
(``convert_slow_tokenizer``), or by the family's own converter where it has one (Marian:
model/families/fairseq.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from model.families import FAMILIES
from model.families.base import CheckpointError, special_token_names, token_id

__all__ = ["languages", "load_tokenizer", "special_token_names", "special_tokens", "token_id"]

def load_tokenizer(folder: Path, family: str) -> Tokenizer:
    """The folder's tokenizer, without padding or truncation (the server sets its own limits)."""
    if (folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    else:
        tokenizer = convert_slow(folder, family)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def convert_slow(folder: Path, family: str) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
        from transformers.convert_slow_tokenizer import convert_slow_tokenizer
    except ImportError as exc:
        raise CheckpointError(
            f"{folder} has no tokenizer.json; converting its slow tokenizer needs transformers "
            "(pip install -e '.[import]')"
        ) from exc
    own = FAMILIES[family].slow_tokenizer
    if own is not None:
        return own(folder)
    try:
        slow = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as exc:
        found = sorted(p.name for p in folder.iterdir())
        raise CheckpointError(f"{folder}: no tokenizer.json and no tokenizer transformers can load ({exc}); "
                              f"found {found}") from exc
    backend = getattr(slow, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    try:
        return convert_slow_tokenizer(slow)
    except ValueError as exc:  # e.g. M2M100's SentencePiece tokenizer: transformers has no converter for it
        raise CheckpointError(f"{folder}: no tokenizer.json, and transformers cannot convert its "
                              f"{type(slow).__name__} into one ({exc})") from exc


def special_tokens(folder: Path, family: str, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    """The ids config.json's ``special_tokens`` needs for this family (see artifacts/README.md)."""
    return FAMILIES[family].special_tokens(folder, hf, tokenizer)


def languages(family: str, tokenizer: Tokenizer) -> dict[str, int]:
    """A multilingual translator's language codes (code -> token id); empty for every other family."""
    return FAMILIES[family].languages(tokenizer)
