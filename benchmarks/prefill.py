"""Prefill time of two exports of one generator: logits at every prompt position vs the last only.

    python -m benchmarks.prefill OLD_FOLDER NEW_FOLDER [--threads 2] [--rounds 3] [--int8]

OLD_FOLDER is an artifact whose decoder has no ``logits_to_keep`` input (every position, as before);
NEW_FOLDER the same weights exported with it, run with ``logits_to_keep = 1`` as the server's prefill
does. Shapes: 16 prompts x 32 tokens and 1 prompt x 200 tokens (empty past); medians of the rounds.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import onnxruntime as ort

from benchmarks.timing import decoder_session, old_new_parser
from contract.names import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    LOGITS_TO_KEEP,
    PAST,
    POSITION_IDS,
    PRESENT,
    kv_names,
)

SHAPES = ((16, 32), (1, 200))


def feeds(dims: dict[str, int], batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    empty = np.zeros((batch, dims.get("n_kv_heads", dims["n_heads"]), 0, dims["d_head"]), np.float32)
    return {
        INPUT_IDS: rng.integers(4, dims["vocab_size"], (batch, length), dtype=np.int64),
        ATTENTION_MASK: np.ones((batch, length), np.int64),
        POSITION_IDS: np.tile(np.arange(length, dtype=np.int64), (batch, 1)),
        **dict.fromkeys(kv_names(PAST, dims["n_layers"]), empty),
    }


def timed(sess: ort.InferenceSession, inputs: dict[str, np.ndarray], outputs: list[str], repeats: int) -> float:
    sess.run(outputs, inputs)  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        sess.run(outputs, inputs)
    return (time.perf_counter() - started) / repeats * 1000


def main() -> None:
    parser = old_new_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--int8", action="store_true", help="the dynamic-int8 variants")
    args = parser.parse_args()
    (old, dims), (new, _) = (decoder_session(folder, args.threads, args.int8) for folder in (args.old, args.new))
    outputs = [LOGITS, *kv_names(PRESENT, dims["n_layers"])]
    keep_last = {LOGITS_TO_KEEP: np.array(1, dtype=np.int64)}
    for batch, length in SHAPES:
        inputs = feeds(dims, batch, length)
        rounds: dict[str, list[float]] = {"old (every position)": [], "new, default (every position)": [],
                                          "new, logits_to_keep=1": []}
        for _ in range(args.rounds):  # interleaved, so drift in machine load hits all three alike
            rounds["old (every position)"].append(timed(old, inputs, outputs, args.repeats))
            rounds["new, default (every position)"].append(timed(new, inputs, outputs, args.repeats))
            rounds["new, logits_to_keep=1"].append(timed(new, inputs | keep_last, outputs, args.repeats))
        base = statistics.median(rounds["old (every position)"])
        for name, times in rounds.items():
            ms = statistics.median(times)
            print(f"{batch:>2} x {length:<3} {name:<32} {ms:8.2f} ms   {base / ms:5.2f}x")


if __name__ == "__main__":
    main()
