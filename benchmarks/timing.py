"""Timing helpers shared by the benchmarks, and what the graph-against-graph benchmarks (prefill.py,
scoring_head.py) share: their command line and the decoder session they time."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime as ort


def median_ms(fn: Callable[[], Any], repeat: int, warmup: int = 1) -> float:
    """The median wall time of `repeat` calls of `fn`, in milliseconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def old_new_parser(doc: str | None) -> argparse.ArgumentParser:
    """The command line of a benchmark that times one artifact's decoder graph against another's."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def decoder_session(folder: Path, threads: int, int8: bool = False) -> tuple[ort.InferenceSession, dict[str, int]]:
    """The artifact's decoder graph on the CPU with `threads` intra-op threads, and its dims (vocab_size too)."""
    config = json.loads((folder / "config.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    path = folder / config["graphs"]["decoder"]["int8_file" if int8 else "file"]
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, config["dims"] | {"vocab_size": config["vocab_size"]}
