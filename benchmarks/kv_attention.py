"""What one decode step's attention costs against its context: ONNX Runtime's GroupQueryAttention alone, writing
into shared buffers as the server's in-place cache does, in the SmolLM2-135M shape (9 query heads, 3 key/value
heads, head size 64; the model has 30 layers), float32 and float16, beside this machine's memory read rate.

    python -m benchmarks.kv_attention [--contexts 64,500,1000,1500,2000] [--batch 4] [--threads 2]
                                      [--out bench_results/kv_attention.json]

A decode step reads every cached key and value once: at long contexts the step's attention is bound by how fast
the cores read memory, whatever copies the cache avoids. Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from benchmarks.record import write_record

HEADS, KV_HEADS, HEAD_SIZE, LAYERS = 9, 3, 64, 30
CAPACITY = 8192  # the model's max_positions: a slot's length
REPEATS = 50


def attention_session(dtype: int, threads: int) -> ort.InferenceSession:
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS)
    hidden, kv_hidden = HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE
    cache: list[str | int | None] = ["B", KV_HEADS, "L", HEAD_SIZE]
    shapes: list[list[str | int | None]] = [["B", "S", hidden], ["B", "S", kv_hidden], ["B", "S", kv_hidden], cache,
                                            cache]
    inputs = [helper.make_tensor_value_info(n, dtype, s) for n, s in zip(names, shapes, strict=False)]
    inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
               helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info(n, dtype, s)
               for n, s in zip(["output", "present_key", "present_value"], [shapes[0], shapes[3], shapes[4]],
                               strict=True)]
    model = helper.make_model(helper.make_graph([node], "attention", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def step_ms(session: ort.InferenceSession, dtype: type[np.floating[Any]], batch: int, context: int) -> float:
    """Median time of one layer's decode-step attention over `context` cached positions per row."""
    rng = np.random.default_rng(0)
    cache = [ort.OrtValue.ortvalue_from_numpy(rng.random((batch, KV_HEADS, CAPACITY, HEAD_SIZE)).astype(dtype))
             for _ in range(2)]
    query: np.ndarray = rng.random((batch, 1, HEADS * HEAD_SIZE)).astype(dtype)
    key: np.ndarray = rng.random((batch, 1, KV_HEADS * HEAD_SIZE)).astype(dtype)
    times = []
    for _ in range(REPEATS):
        binding = session.io_binding()
        for name, value in (("query", query), ("key", key), ("value", key)):
            binding.bind_cpu_input(name, value)
        binding.bind_cpu_input("seqlens_k", np.full(batch, context, np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(context + 1, np.int32))
        for past, present, value in (("past_key", "present_key", cache[0]), ("past_value", "present_value", cache[1])):
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        binding.bind_output("output", "cpu")
        started = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1000


def read_rate_gb_s() -> float:
    """How fast one thread sums a 256 MB float32 array (memory read bandwidth, roughly)."""
    data = np.ones(64_000_000, dtype=np.float32)
    started = time.perf_counter()
    for _ in range(5):
        data.sum()
    return round(5 * data.nbytes / (time.perf_counter() - started) / 1e9, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="64,500,1000,1500,2000")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="bench_results/kv_attention.json")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    sessions: dict[str, tuple[ort.InferenceSession, type[np.floating[Any]]]] = {
        "float32": (attention_session(TensorProto.FLOAT, args.threads), np.float32),
        "float16": (attention_session(TensorProto.FLOAT16, args.threads), np.float16),
    }
    rows: list[dict[str, Any]] = []
    heading = f"ms per layer, ms per step ({LAYERS} layers), GB/s read"
    print(f"| context | {' | '.join(f'{name}: {heading}' for name in sessions)} |")
    print(f"|---|{'---|' * len(sessions)}")
    for context in contexts:
        row: dict[str, Any] = {"context": context}
        for name, (session, dtype) in sessions.items():
            ms = step_ms(session, dtype, args.batch, context)
            read = 2 * args.batch * KV_HEADS * context * HEAD_SIZE * np.dtype(dtype).itemsize  # keys and values
            row[name] = {"ms_per_layer": round(ms, 3), "ms_per_step": round(ms * LAYERS, 1),
                         "gb_per_s": round(read / ms / 1e6, 1)}
        rows.append(row)
        cells = [f"{r['ms_per_layer']}, {r['ms_per_step']}, {r['gb_per_s']}" for r in (row[n] for n in sessions)]
        print(f"| {context} | {' | '.join(cells)} |")
    rate = read_rate_gb_s()
    print(f"numpy's one-thread read rate: {rate} GB/s")
    options = (("contexts", args.contexts), ("batch", args.batch), ("threads", args.threads))
    write_record("kv_attention", options, Path(args.out), rows=rows, numpy_read_gb_s=rate)


if __name__ == "__main__":
    main()
