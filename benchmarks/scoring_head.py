"""One translator decoder step of two exports of the same weights: without the scoring head (logits out,
then the standalone head, service/runtime/scoring_head.onnx) and with it (the graph's top_logprobs/top_ids).

    python -m benchmarks.scoring_head OLD_FOLDER NEW_FOLDER [--threads 2] [--rows 64] [--repeats 500]

OLD_FOLDER is a translator whose decoder has no ``k`` input (artifacts/translator); NEW_FOLDER the same
weights exported with it (``python -m scripts.export translator --from-artifact --out DIR`` on a copy).
A beam step fetches the head's [rows, k] (k = 8, beam 4) where the old graph fetched the logits; a greedy
step fetches the logits from both (k left at its default, 0). Calls are interleaved, so drift in machine
load hits all four alike; the 10th percentile is the least disturbed figure on a shared machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from benchmarks.timing import decoder_session, old_new_parser
from contract.names import (
    ATTENTION_MASK,
    CROSS,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    PAST,
    POSITION_IDS,
    PRESENT,
    TOP_IDS,
    TOP_K,
    TOP_LOGPROBS,
    kv_names,
)
from service.runtime.scoring_head import TopLogprobs

PAST_LENGTH, SOURCE_LENGTH, K = 20, 30, 8


def feeds(dims: dict[str, int], rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    layers, heads, d_head = dims["n_decoder_layers"], dims["n_heads"], dims["d_head"]
    return {
        INPUT_IDS: rng.integers(4, dims["vocab_size"], (rows, 1), dtype=np.int64),
        ATTENTION_MASK: np.ones((rows, PAST_LENGTH + 1), np.int64),
        POSITION_IDS: np.full((rows, 1), PAST_LENGTH, np.int64),
        ENCODER_ATTENTION_MASK: np.ones((rows, SOURCE_LENGTH), np.int64),
        **{n: rng.standard_normal((rows, heads, SOURCE_LENGTH, d_head), dtype=np.float32)
           for n in kv_names(CROSS, layers)},
        **{n: rng.standard_normal((rows, heads, PAST_LENGTH, d_head), dtype=np.float32)
           for n in kv_names(PAST, layers)},
    }


def main() -> None:
    parser = old_new_parser(__doc__)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=500)
    args = parser.parse_args()
    (old, dims), (new, _) = (decoder_session(folder, args.threads) for folder in (args.old, args.new))
    inputs, head = feeds(dims, args.rows), TopLogprobs()
    present = kv_names(PRESENT, dims["n_decoder_layers"])
    with_k = inputs | {TOP_K: np.array([K], dtype=np.int64)}
    steps: dict[str, Callable[[], object]] = {
        "beam, old: logits + standalone head": lambda: head(old.run([LOGITS, *present], inputs)[0][:, -1], K),
        "beam, new: the graph's head": lambda: new.run([TOP_LOGPROBS, TOP_IDS, *present], with_k),
        "greedy, old: logits": lambda: old.run([LOGITS, *present], inputs),
        "greedy, new: logits (k = 0)": lambda: new.run([LOGITS, *present], inputs),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats + 10):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
    print(f"{args.rows} rows, past {PAST_LENGTH}, source {SOURCE_LENGTH}, {args.threads} threads (ms):")
    for name, values in times.items():
        p10, median = (np.percentile(values[10:], q) * 1000 for q in (10, 50))
        print(f"  {name:<38} p10 {p10:6.3f}   median {median:6.3f}")


if __name__ == "__main__":
    main()
