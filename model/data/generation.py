"""English corpus for the generator: US State of the Union addresses, split by speech.

Speeches are sorted by file name (year first); speech ``i`` goes to test when
``i % 20 == 0``, to valid when ``i % 20 == 10``, else to train. Each output
file holds documents separated by a line containing only ``<|endoftext|>``.
"""

from __future__ import annotations

import re
from pathlib import Path

from model.data import normalize_text

DOC_SEPARATOR = "<|endoftext|>"
SPLITS = ("train", "valid", "test")
_STAGE_DIRECTION = re.compile(r"[(\[](?:applause|laughter|missing text)\.?[)\]]", re.IGNORECASE)


def clean_speech(text: str) -> str:
    """Drop "(Applause.)"-style stage directions, normalise whitespace, keep paragraphs."""
    paragraphs = (normalize_text(_STAGE_DIRECTION.sub(" ", p)) for p in re.split(r"\n\s*\n", text))
    return "\n".join(p for p in paragraphs if p)


def speech_split(index: int) -> str:
    """Split of the ``index``-th speech in sorted order."""
    return "test" if index % 20 == 0 else "valid" if index % 20 == 10 else "train"


def write_documents(path: Path, documents: list[str]) -> None:
    """Write documents separated by a line holding only the separator."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"\n{DOC_SEPARATOR}\n".join(documents) + "\n", encoding="utf-8")


def read_documents(path: Path) -> list[str]:
    """Inverse of ``write_documents``."""
    text = path.read_text(encoding="utf-8")
    return [doc.strip("\n") for doc in text.split(f"\n{DOC_SEPARATOR}\n") if doc.strip()]


def build_generation(sotu_dir: Path, out_dir: Path) -> dict[str, dict[str, int]]:
    """Write ``{train,valid,test}.txt``; return documents and words per file."""
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    for index, path in enumerate(sorted(sotu_dir.glob("*.txt"))):
        speech = clean_speech(path.read_text(encoding="utf-8"))
        if speech:
            splits[speech_split(index)].append(speech)
    counts = {}
    for name, documents in splits.items():
        write_documents(out_dir / f"{name}.txt", documents)
        counts[f"{name}.txt"] = {"documents": len(documents), "words": sum(len(d.split()) for d in documents)}
    return counts
