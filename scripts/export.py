"""Export trained checkpoints (runs/<model>/) to artifacts/<model>/, or tiny random models for tests.

    python -m scripts.export translator generator classifier   # from runs/ to artifacts/
    python -m scripts.export translator --run runs/translator/cooldown --if-better
                                                               # a cooled-down branch, only if its
                                                               # validation loss beats the committed card's
    python -m scripts.export --tiny --out /tmp/tiny-artifacts  # tiny random models
    python -m scripts.export --tiny --out /tmp/tiny embedder reranker
                                                               # the tiny encoder artifacts beside them
    python -m scripts.export generator --from-artifact         # re-export artifacts/generator from the
                                                               # weights in its own graphs (this exporter)
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from contract.kinds import KINDS
from model.export.tiny import TINY_ENCODERS
from model.training.checkpoint import export_checkpoint, reexport_artifact
from scripts.card_examples import refresh_card

TINY_ONLY = tuple(TINY_ENCODERS)  # tiny encoder artifacts, --tiny only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(KINDS)} (default: all three); with --tiny also "
                                                   f"{', '.join(TINY_ONLY)}")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="training output folder")
    parser.add_argument("--out", type=Path, default=Path("artifacts"))
    parser.add_argument("--tiny", action="store_true", help="export tiny randomly initialized models")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 variants")
    parser.add_argument("--run", type=Path, default=None, help="export this run folder (one model) instead")
    parser.add_argument("--from-artifact", action="store_true",
                        help="re-export <out>/<model> from the weights its graphs hold (no run folder needed)")
    parser.add_argument("--if-better", action="store_true",
                        help="replace the artifact only if the run's validation loss is lower than its card's")
    args = parser.parse_args()
    known = (*KINDS, *TINY_ONLY) if args.tiny else tuple(KINDS)
    unknown = set(args.models) - set(known)
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}; choose from {', '.join(known)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.tiny:
        from model.export.tiny import export_tiny_artifacts

        export_tiny_artifacts(args.out, tuple(args.models or KINDS))
        return
    if args.run and len(args.models) != 1:
        parser.error("--run exports one model: name it")
    if args.from_artifact:
        for kind in args.models or KINDS:
            reexport_artifact(kind, args.out / kind)
            refresh_card(args.out / kind)  # the card's out-of-domain answers, asked again of the new graphs
        return
    for kind in args.models or KINDS:
        run = args.run or args.runs / kind
        if args.if_better and not improves(run / "card.json", args.out / kind / "card.json"):
            continue
        export_checkpoint(kind, run, args.out / kind, int8=not args.no_int8)
        refresh_card(args.out / kind)  # the exported model's own answers outside its training domains


def validation_loss(card: dict[str, Any]) -> float:
    metrics = card.get("metrics", {})
    return float(metrics.get("val_loss", metrics.get("best_val_loss", float("inf"))))


def improves(candidate: Path, committed: Path) -> bool:
    """True when the candidate card's validation loss is lower than the committed one's (or none is committed)."""
    new = validation_loss(json.loads(candidate.read_text()))
    old = validation_loss(json.loads(committed.read_text())) if committed.exists() else float("inf")
    print(f"{candidate.parent}: validation loss {new:.4f} vs committed {old:.4f}: "
          f"{'replacing' if new < old else 'keeping the committed artifact'}")
    return new < old


if __name__ == "__main__":
    main()
