"""Command-line options that the measuring benchmarks share."""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measurement_options(parser: argparse.ArgumentParser, record: str, rounds: int) -> None:
    """--artifacts (the served models), --rounds, --threads (intra-op, 2 by default) and --out (the JSON
    record, bench_results/<record>.json by default)."""
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / f"{record}.json")
