"""Model cards: card.json (machine-readable) and card.md (a short summary for people)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from contract.cards import use_summary
from model.training.intended_use import with_intended_use


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once by parameters()


def write_card(run_dir: Path, card: dict[str, Any]) -> None:
    """card.json and card.md of one of our models, with its intended use (model/training/intended_use.py)."""
    card = with_intended_use(card)
    (run_dir / "card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
    lines = [f"# {card['model']}", "", card.get("summary", ""), ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| parameters | {card['parameters']:,} |", f"| training | {card['training']['minutes']:.1f} min, "
              f"{card['training']['steps']} steps on {card['training']['hardware']} |"]
    lines += [f"| data | {card['data']['description']} |", f"| license | {card['data']['license']} |"]
    for name, value in flatten_metrics(card["metrics"]):
        lines.append(f"| {name} | {value} |")
    lines += use_sections(card)
    (run_dir / "card.md").write_text("\n".join(lines) + "\n")


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def use_sections(card: dict[str, Any]) -> list[str]:
    """card.md's "Intended use" and "Outside the training domains" sections (none when the card has no
    intended use); both card writers (this one and model/importing/hf_artifact.py's) end with them."""
    if use_summary(card) is None:
        return []
    use = " ".join(card["intended_use"].split()).rstrip(".")
    lines = ["", "## Intended use", "", f"{use[0].upper()}{use[1:]}.", ""]
    lines += ["Trained on:", ""] + [f"- {domain}" for domain in card.get("domains", [])]
    if card.get("out_of_scope"):
        lines += ["", "Not for:", ""] + [f"- {item}" for item in card["out_of_scope"]]
    examples = card.get("out_of_domain_examples")
    if examples:
        lines += ["", "## Outside the training domains", "", card.get("out_of_domain_examples_how", ""), "",
                  "| input | the model's answer | note |", "|---|---|---|"]
        lines += [f"| {_cell(e['input'])} | {_cell(e['output'])} | {_cell(e['note'])} |" for e in examples]
    return lines


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


def plot_learning_curve(card: dict[str, Any], path: Path) -> None:
    """Validation loss against training minutes over every segment, each segment's start marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    training = card["training"]
    history = training.get("history", [])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["minutes"] for h in history], [h["val_loss"] for h in history], marker=".", label="validation loss")
    for segment in training.get("segments", []):
        if "start_minutes" in segment:  # segments recorded before histories were kept have totals only
            ax.axvline(segment["start_minutes"], color="grey", alpha=0.4, linestyle="--")
            ax.annotate(segment["schedule"], (segment["start_minutes"], 1.0), xycoords=("data", "axes fraction"),
                        fontsize=7, rotation=90, va="top", ha="right", color="grey")
    ax.set_xlabel(f"training minutes (total; {training.get('hardware', '')})")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{card['model']}: learning curve over all segments")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
