"""Train one model, evaluate it and write its model card into runs/<model>/.

    python -m scripts.train translator --minutes 75
    python -m scripts.train generator --minutes 35
    python -m scripts.train classifier --minutes 30

Runs resume from runs/<model>/ when a checkpoint is there (use --no-resume to start over).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from model import recipes

RECIPES = {"translator": "train_translator", "generator": "train_generator", "classifier": "train_classifier"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(RECIPES))
    parser.add_argument("--minutes", type=float, default=30.0, help="training time budget")
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--tiny", action="store_true", help="tiny model, a few steps (smoke test)")
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N test items")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = getattr(recipes, RECIPES[args.model])
    recipe(recipes.RecipeArgs(args.data, args.runs / args.model, args.minutes, args.tiny, not args.no_resume,
                              args.eval_limit))


if __name__ == "__main__":
    main()
