"""Write each model card's intended use and its served model's answers to inputs outside its training
domains (model/intended_use.py's probes, asked through the server's own routes: model/card_examples.py).

    python -m scripts.card_examples                          # every model in artifacts/
    python -m scripts.card_examples translator --threads 2

Rewrites card.json and card.md of each artifact folder (nothing else: no graph, no golden.json) and
prints the answers. The export runs the same code on what it writes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from model.card_examples import refresh_card


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="artifact folder names (default: every one with a card)")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime threads")
    args = parser.parse_args()
    names = args.models or sorted(p.parent.name for p in args.artifacts.glob("*/config.json"))
    for name in names:
        card = refresh_card(args.artifacts / name, args.threads)
        if card is None:
            print(f"{name}: its card has no intended-use record (model/intended_use.py); left as it is")
            continue
        print(json.dumps({name: card["out_of_domain_examples"]}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
