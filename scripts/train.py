"""Train one model; evaluate it and write its model card.

The translator and the generator train on a warmup-stable-decay schedule, in segments that add up:

    python -m scripts.train translator --minutes 120        # one more stable segment of 120 minutes
    python -m scripts.train translator --cooldown 20        # branch runs/translator/cooldown/, decay it to
                                                            # zero in 20 minutes, evaluate, write its card
    python -m scripts.export translator --run runs/translator/cooldown

A stable segment resumes runs/<model>/ when it is there; on a fresh machine it recovers the weights
of the committed artifacts/<model>/ (fresh optimizer) and carries its totals over; --no-resume starts
from scratch. The classifier's recipe (MLM + NSP, then fine-tuning) still runs in one go:

    python -m scripts.train classifier --minutes 30
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from contract.kinds import KINDS
from scripts import recipes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(KINDS))
    parser.add_argument("--minutes", type=float, default=30.0, help="time budget of this segment")
    parser.add_argument("--cooldown", type=float, default=0.0, metavar="MINUTES",
                        help="decay a branch of the stable run to zero in MINUTES, then evaluate it")
    parser.add_argument("--device", default="cpu", help="torch device of the training (cuda on a GPU)")
    parser.add_argument("--cooldown-phase", choices=("both", "train", "evaluate"), default="both",
                        help="train: decay the branch and stop (a GPU without the server); evaluate: evaluate "
                             "and card the decayed branch as it is")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="the translator's tokens per batch")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"),
                        help="committed artifacts to recover weights from when runs/<model>/ is empty")
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--tiny", action="store_true", help="tiny model, a few steps (smoke test)")
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the classifier's fine-tuning runs")
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N test items")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = getattr(recipes, f"train_{args.model}")  # one recipe per kind (tests/model/test_kinds.py)
    recipe(recipes.RecipeArgs(args.data, args.runs / args.model, args.minutes, args.tiny, not args.no_resume,
                              args.eval_limit, args.cooldown, args.artifacts, args.device, args.jobs,
                              args.cooldown_phase, args.batch_tokens))


if __name__ == "__main__":
    main()
