"""What a model card says a model is for, in one line.

card.json's ``intended_use`` (a phrase) and ``domains`` (what it was trained on) are written by the
exporter from model/training/intended_use.py; this line is what GET /v1/models answers as ``summary`` and what
card.md opens its "Intended use" section with. Standard library only (the server and model/ share it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def use_summary(card: Mapping[str, Any]) -> str | None:
    """"<intended use>; trained on <domain>, <domain> and <domain>." on one line, or None when the card
    states no intended use (an untrained test model, a checkpoint imported without one)."""
    use = card.get("intended_use")
    if not isinstance(use, str) or not use.strip():
        return None
    line = use.strip().rstrip(".")
    domains = [d.strip() for d in card.get("domains") or [] if isinstance(d, str) and d.strip()]
    if domains:
        line += f"; trained on {_join(domains)}"
    return " ".join(f"{line}.".split())  # one line, whatever the card's whitespace


def no_use_summary(task: str) -> str:
    """The summary of a model whose card states no intended use ("an embedding model; ...")."""
    article = "an" if task[:1].lower() in "aeiou" else "a"
    return f"{article} {task} model; its card states no intended use or training domains"
