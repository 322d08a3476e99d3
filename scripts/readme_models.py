"""What each committed model is for and not for, written into README.md from the models' cards.

    python -m scripts.readme_models          # after a card's intended_use, domains or out_of_scope changes

The cards (artifacts/<name>/card.json) hold the model's intended use, training domains and out-of-scope
uses; a newcomer reads the README, so the README carries them too, between the markers below.
tests/deploy/test_deploy_config.py fails when the README's block differs from what this renders.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from contract.cards import use_summary
from service.settings import discover_models

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- models:begin (python -m scripts.readme_models) -->"
END = "<!-- models:end -->"
WIDTH = 110


def model_lines(name: str, card: dict[str, Any]) -> list[str]:
    """One list item: the card's use and domains, then what it is not for."""
    text = f"**{name}**: {use_summary(card) or 'its card states no intended use.'}"
    out_of_scope = [item.strip() for item in card.get("out_of_scope") or [] if isinstance(item, str) and item.strip()]
    if out_of_scope:
        text += f" Not for: {'; '.join(out_of_scope)}."
    return textwrap.wrap(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)


def render(artifacts: Path) -> str:
    """The block between BEGIN and END (markers included), every model of `artifacts` in serving order."""
    lines = [BEGIN]
    for name in discover_models(artifacts):
        card_path = artifacts / name / "card.json"
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
        lines += model_lines(name, card)
    return "\n".join([*lines, END])


def replaced(readme: str, block: str) -> str:
    """`readme` with its block replaced by `block`."""
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[:start] + block + readme[end:]


def main() -> None:
    README.write_text(replaced(README.read_text(), render(ROOT / "artifacts")))
    print(f"wrote the models' uses into {README.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
