"""Data recipes: fetch pinned raw corpora, build deterministic splits, describe outputs.

Shared helpers for the recipe modules live here: text normalisation, JSONL
input/output and the checksum entries recorded in ``data/manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFC-normalise, turn every whitespace run (NBSP included) into one space, strip."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line (UTF-8, not ASCII-escaped); return the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSONL file."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path, **counts: int) -> dict[str, Any]:
    """Manifest entry for a produced file: its sha256 plus the given counts."""
    return {"sha256": sha256_file(path), **counts}
