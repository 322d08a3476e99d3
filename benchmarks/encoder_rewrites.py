"""An encoder graph three ways, in process: as exported, as the server loads it (its attention rewritten by
service/runtime/fusion.py), and as ONNX Runtime's own transformer optimizer leaves it
(`onnxruntime.transformers.optimizer.optimize_model`, model_type "bert": the library's fusions for
BERT-like graphs, Attention, SkipLayerNormalization and Gelu among them).

    python -m benchmarks.encoder_rewrites [--artifacts artifacts] [--models classifier,classifier-minilm]
                                          [--rows 1,32] [--tokens 12] [--rounds 15] [--threads 2]
                                          [--out bench_results/encoder_rewrites.json]

The three sessions alternate within each round (ORT_ENABLE_ALL, --threads intra-op threads); the table gives
each graph's median time per run and its ratio to the exported graph's, the nodes ONNX Runtime keeps after
its own session optimizer, what the transformer optimizer fused, and the largest logit difference from the
exported graph. Prints a Markdown table and writes the JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.transformers.optimizer import optimize_model

from benchmarks.options import measurement_options
from benchmarks.record import write_record
from service.runtime.artifact import load_artifact
from service.runtime.fusion import fuse_attention


def session(model: onnx.ModelProto, threads: int, optimized: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def kept_nodes(model: onnx.ModelProto, threads: int, scratch: Path) -> int:
    """How many nodes ONNX Runtime's session optimizer leaves of `model`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session(model, threads, scratch)
    return len(onnx.load(str(scratch)).graph.node)


def graphs(folder: Path) -> tuple[dict[str, onnx.ModelProto], dict[str, int]]:
    """The three graphs of an artifact's encoder, and what the transformer optimizer fused in it."""
    artifact = load_artifact(folder)
    spec = artifact.graphs["encoder"]
    path = folder / spec.file
    exported = onnx.load(str(path))
    fused = fuse_attention(onnx.load(str(path)))
    dims = artifact.dims
    library = optimize_model(str(path), model_type="bert", num_heads=dims["n_heads"], hidden_size=dims["d_model"],
                             opt_level=0, use_gpu=False)
    stats = {k: v for k, v in library.get_fused_operator_statistics().items() if v}
    rewritten = fused.model if fused is not None else exported
    return {"exported": exported, "served": rewritten, "ort transformers": library.model}, stats


def feeds(sess: ort.InferenceSession, rows: int, tokens: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {
        "input_ids": rng.integers(5, vocab, (rows, tokens)).astype(np.int64),
        "attention_mask": np.ones((rows, tokens), np.int64),
        "token_type_ids": np.zeros((rows, tokens), np.int64),
    }
    return {i.name: values[i.name] for i in sess.get_inputs()}


def measure(
    folder: Path, rows_list: list[int], tokens: int, rounds: int, threads: int, scratch: Path
) -> list[dict[str, Any]]:
    models, fused_ops = graphs(folder)
    vocab = load_artifact(folder).vocab_size
    sessions = {name: session(model, threads) for name, model in models.items()}
    nodes = {name: kept_nodes(model, threads, scratch) for name, model in models.items()}
    out = sessions["exported"].get_outputs()[0].name
    results = []
    for rows in rows_list:
        given = {name: feeds(s, rows, tokens, vocab, seed=rows) for name, s in sessions.items()}
        logits = {name: s.run([out], given[name])[0] for name, s in sessions.items()}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        calls = max(5, 200 // rows)
        for _ in range(rounds):
            for name, s in sessions.items():
                for _ in range(3):
                    s.run([out], given[name])
                started = time.perf_counter()
                for _ in range(calls):
                    s.run([out], given[name])
                times[name].append((time.perf_counter() - started) / calls)
        base = statistics.median(times["exported"])
        for name in sessions:
            median = statistics.median(times[name])
            results.append({
                "model": folder.name, "rows": rows, "tokens": tokens, "graph": name,
                "us_per_run": round(median * 1e6, 1),
                "per_exported": round(median / base, 3), "nodes_after_ort": nodes[name],
                "max_logit_diff": float(np.abs(logits[name] - logits["exported"]).max()),
                "fused_by_ort_transformers": fused_ops if name == "ort transformers" else None,
            })
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    measurement_options(parser, "encoder_rewrites", rounds=15)
    parser.add_argument("--models", default="classifier,classifier-minilm")
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    scratch = args.out.with_suffix(".scratch.onnx")
    results: list[dict[str, Any]] = []
    try:
        for model in args.models.split(","):
            results += measure(args.artifacts / model, rows_list, args.tokens, args.rounds, args.threads, scratch)
    finally:
        scratch.unlink(missing_ok=True)
    print("| model | rows x tokens | graph | us per run | / exported | nodes after ORT | max logit diff |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['rows']} x {r['tokens']} | {r['graph']} | {r['us_per_run']:,.0f} | "
              f"{r['per_exported']:.2f} | {r['nodes_after_ort']} | {r['max_logit_diff']:.1e} |")
    fused = {r["model"]: r["fused_by_ort_transformers"] for r in results if r["fused_by_ort_transformers"]}
    print(f"ONNX Runtime's transformer optimizer fused: {fused}")
    options = (("models", args.models), ("rows", args.rows), ("tokens", args.tokens), ("rounds", args.rounds),
               ("threads", args.threads))
    write_record("encoder_rewrites", options, args.out, onnxruntime=ort.__version__, results=results)


if __name__ == "__main__":
    main()
