"""Export trained checkpoints (runs/<model>/) to artifacts/<model>/, or tiny random models for tests.

    python -m scripts.export translator generator classifier   # from runs/ to artifacts/
    python -m scripts.export --tiny --out /tmp/tiny-artifacts  # tiny random models
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from model.checkpoint import export_checkpoint
from model.export import export_tiny_artifacts

KINDS = ("translator", "generator", "classifier")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help=f"any of {', '.join(KINDS)} (default: all three)")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="training output folder")
    parser.add_argument("--out", type=Path, default=Path("artifacts"))
    parser.add_argument("--tiny", action="store_true", help="export tiny randomly initialized models")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 variants")
    args = parser.parse_args()
    unknown = set(args.models) - set(KINDS)
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}; choose from {', '.join(KINDS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.tiny:
        export_tiny_artifacts(args.out, tuple(args.models or KINDS))
        return
    for kind in args.models or KINDS:
        export_checkpoint(kind, args.runs / kind, args.out / kind, int8=not args.no_int8)


if __name__ == "__main__":
    main()
