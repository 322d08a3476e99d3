"""Model cards: card.json (machine-readable) and card.md (a short summary for people)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once by parameters()


def write_card(run_dir: Path, card: dict[str, Any]) -> None:
    (run_dir / "card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
    lines = [f"# {card['model']}", "", card.get("summary", ""), ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| parameters | {card['parameters']:,} |", f"| training | {card['training']['minutes']:.1f} min, "
              f"{card['training']['steps']} steps on {card['training']['hardware']} |"]
    lines += [f"| data | {card['data']['description']} |", f"| license | {card['data']['license']} |"]
    for name, value in flatten_metrics(card["metrics"]):
        lines.append(f"| {name} | {value} |")
    (run_dir / "card.md").write_text("\n".join(lines) + "\n")


def flatten_metrics(metrics: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in metrics.items():
        if key == "examples":
            continue
        if isinstance(value, dict):
            out += flatten_metrics(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out
