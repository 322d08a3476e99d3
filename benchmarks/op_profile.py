"""Where one prefill of a generator's decoder spends its time, by ONNX operator type (ONNX Runtime's profiler).

    python -m benchmarks.op_profile ARTIFACT_FOLDER [--tokens 1000] [--threads 2] [--runs 3]
                                    [--out bench_results/op_profile.json]

Feeds one prompt of random ids with an empty cache (zero-length, or buffers as long as the prompt for a graph that
writes its cache in place) and `logits_to_keep` 1, as the server's prefill does. Prints each operator type's
share of the kernels' time and writes the JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.record import write_record
from contract.names import ATTENTION_MASK, IN_PLACE_AXIS, INPUT_IDS, LOGITS, LOGITS_TO_KEEP, PAST, POSITION_IDS


def feeds(config: dict[str, Any], tokens: int) -> dict[str, np.ndarray]:
    graph = config["graphs"]["decoder"]
    in_place = any(IN_PLACE_AXIS in spec["shape"] for spec in graph["inputs"])
    ids = np.random.default_rng(0).integers(3, int(config["vocab_size"]), (1, tokens))
    fed = {INPUT_IDS: ids.astype(np.int64), ATTENTION_MASK: np.ones((1, tokens), np.int64),
           POSITION_IDS: np.arange(tokens, dtype=np.int64)[None], LOGITS_TO_KEEP: np.array(1, np.int64)}
    for spec in graph["inputs"]:
        if spec["name"].startswith(f"{PAST}."):
            _, heads, _, size = spec["shape"]
            fed[spec["name"]] = np.zeros((1, heads, tokens if in_place else 0, size), np.float32)
    return fed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_results/op_profile.json"))
    args = parser.parse_args()
    config = json.loads((args.artifact / "config.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "profile")
    session = ort.InferenceSession(str(args.artifact / config["graphs"]["decoder"]["file"]), options,
                                   providers=["CPUExecutionProvider"])
    fed = {k: v for k, v in feeds(config, args.tokens).items() if k in {i.name for i in session.get_inputs()}}
    seconds = []
    for _ in range(args.runs):
        started = time.perf_counter()
        session.run([LOGITS], fed)
        seconds.append(time.perf_counter() - started)
    by_op: collections.Counter[str] = collections.Counter()
    for event in json.loads(Path(session.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    total = sum(by_op.values())
    shares = {op: round(us / total, 3) for op, us in by_op.most_common()}
    print(f"{args.tokens}-token prefill: {min(seconds):.2f} s at best of {args.runs}")
    for op, share in list(shares.items())[:10]:
        print(f"  {op:28s} {100 * share:5.1f}%")
    write_record("op_profile", (("tokens", args.tokens), ("threads", args.threads), ("runs", args.runs)), args.out,
                 artifact=str(args.artifact), best_s=round(min(seconds), 3), shares=shares)


if __name__ == "__main__":
    main()
