"""Measure the exported graphs and record the results in each artifact's card.

    python -m benchmarks.graphs [--artifacts artifacts] [--runs runs] [--threads 1]

For the generator and the translator decoder, side by side in one run:
  - cached decode step (past 255 + 1 new token) vs full recompute of 256 tokens (ORT),
  - ORT vs PyTorch eager for the same cached step,
  - int8 vs fp32 graph for the same cached step.
Quality of the int8 variants: classifier test accuracy, translator greedy BLEU on the
first --bleu-sentences test verses, generator perplexity on the first test tokens,
all computed with ONNX Runtime on both graphs. Prints a table, writes
bench_results/export.json and adds an "export_report" section to artifacts/<model>/card.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from benchmarks import timing
from model.export.graphs import round_weights_to_fp16
from model.kinds import config_from_dict, model_kind
from model.network.translator import Translator
from model.training.checkpoint import load_trained

CONTEXT = 256


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def median_ms(fn: Callable[[], Any], repeat: int = 30) -> float:
    return timing.median_ms(fn, repeat, warmup=3)


def kv(prefix: str, n_layers: int, shape: tuple[int, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {f"{prefix}.{i}.{k}": rng.standard_normal(shape).astype(np.float32)
            for i in range(n_layers) for k in ("key", "value")}


Feeds = dict[str, np.ndarray]
Past = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Decoder:
    """What a decoder's cached step takes beside the tokens and its own cache, and how PyTorch runs it."""

    layers: str  # the dims field of its layer count
    extra_feeds: Callable[[dict[str, Any], np.random.Generator], Feeds]  # (dims, rng) -> more inputs
    torch_step: Callable[[torch.nn.Module, dict[str, torch.Tensor], Past], Callable[[], Any]]


def no_feeds(d: dict[str, Any], rng: np.random.Generator) -> Feeds:
    return {}


def cross_feeds(d: dict[str, Any], rng: np.random.Generator) -> Feeds:
    """The encoder's side of a translator decoder step: a 32-token source, its cross-attention keys and values."""
    src = 32
    return {"encoder_attention_mask": np.ones((1, src), dtype=np.int64),
            **kv("cross", d["n_decoder_layers"], (1, d["n_heads"], src, d["d_head"]), rng)}


def generator_step(model: torch.nn.Module, t: dict[str, torch.Tensor], past: Past) -> Callable[[], Any]:
    return lambda: model(t["input_ids"], t["attention_mask"], t["position_ids"], past)


def translator_step(model: torch.nn.Module, t: dict[str, torch.Tensor], past: Past) -> Callable[[], Any]:
    cross = [(t[f"cross.{i}.key"], t[f"cross.{i}.value"]) for i in range(len(past))]
    assert isinstance(model, Translator)  # the translator kind's network: the decoder step is its decode()
    translator = model
    return lambda: translator.decode(t["input_ids"], t["attention_mask"], t["position_ids"],
                                     t["encoder_attention_mask"], cross, past)


def decoder_feeds(config: dict[str, Any], decoder: Decoder, past_len: int, new: int,
                  rng: np.random.Generator) -> Feeds:
    """Batch-1 inputs for a decoder: `new` tokens after `past_len` cached ones."""
    d = config["dims"]
    feeds = {
        "input_ids": rng.integers(4, config["vocab_size"], (1, new)).astype(np.int64),
        "attention_mask": np.ones((1, past_len + new), dtype=np.int64),
        "position_ids": np.arange(past_len, past_len + new, dtype=np.int64)[None],
        **kv("past_key_values", d[decoder.layers], (1, d.get("n_kv_heads", d["n_heads"]), past_len, d["d_head"]), rng),
    }
    return feeds | decoder.extra_feeds(d, rng)


def torch_step(model: torch.nn.Module, config: dict[str, Any], decoder: Decoder, feeds: Feeds) -> Callable[[], Any]:
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    layers = config["dims"][decoder.layers]
    past = [(t[f"past_key_values.{i}.key"], t[f"past_key_values.{i}.value"]) for i in range(layers)]
    return decoder.torch_step(model, t, past)


def reference_model(folder: Path, run_dir: Path) -> tuple[torch.nn.Module, str]:
    """The PyTorch model for the eager timing: the trained run if it is on disk, otherwise the same
    architecture (from the artifact's card) with random weights; step time does not depend on the values."""
    if (run_dir / "best.safetensors").exists():
        return load_trained(folder.name, run_dir), "trained"
    card = json.loads((folder / "card.json").read_text())
    config = dict(card["config"])
    model = model_kind(folder.name).build(config_from_dict(config))
    return model.eval(), "random (same architecture; timing only)"


def bench_decoder(folder: Path, decoder: Decoder, runs: Path, threads: int) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    role = "decoder"
    graph = config["graphs"][role]
    fp32, int8 = session(folder / graph["file"], threads), session(folder / graph["int8_file"], threads)
    rng = np.random.default_rng(0)
    step = decoder_feeds(config, decoder, CONTEXT - 1, 1, rng)
    full = decoder_feeds(config, decoder, 0, CONTEXT, rng)
    logits_only = ["logits"]
    model, weights = reference_model(folder, runs / config["name"])
    round_weights_to_fp16(model)
    torch.set_num_threads(threads)
    with torch.no_grad():
        results = {
            "ort_cached_step_ms": median_ms(lambda: fp32.run(logits_only, step)),
            "ort_full_recompute_ms": median_ms(lambda: fp32.run(logits_only, full), repeat=10),
            "torch_cached_step_ms": median_ms(torch_step(model, config, decoder, step)),
            "ort_int8_cached_step_ms": median_ms(lambda: int8.run(logits_only, step)),
        }
    results["cached_vs_recompute_speedup"] = results["ort_full_recompute_ms"] / results["ort_cached_step_ms"]
    results["ort_vs_torch_speedup"] = results["torch_cached_step_ms"] / results["ort_cached_step_ms"]
    results["int8_vs_fp32_speedup"] = results["ort_cached_step_ms"] / results["ort_int8_cached_step_ms"]
    return {**{k: round(v, 3) for k, v in results.items()}, "torch_weights": weights}


def classifier_accuracy(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    data, threads = args.data, args.threads
    config = json.loads((folder / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(config["max_positions"])
    tokenizer.enable_padding(pad_id=config["special_tokens"]["pad"])
    rows = [json.loads(line) for line in (data / "classification" / "test.jsonl").read_text().splitlines()]
    out = {}
    for key in ("file", "int8_file"):
        sess = session(folder / config["graphs"]["encoder"][key], threads)
        correct, start = 0, time.perf_counter()
        for i in range(0, len(rows), 64):
            enc = tokenizer.encode_batch([r["text"] for r in rows[i : i + 64]])
            feeds = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                     "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
                     "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
            logits = sess.run(["logits"], feeds)[0]
            correct += int((logits.argmax(-1) == np.array([r["label"] for r in rows[i : i + 64]])).sum())
        name = "fp32" if key == "file" else "int8"
        out[f"{name}_test_accuracy"] = round(correct / len(rows), 4)
        out[f"{name}_seconds"] = round(time.perf_counter() - start, 2)
    return out


def greedy_translate(encoder: ort.InferenceSession, decoder: ort.InferenceSession, config: dict[str, Any],
                     ids: list[int], max_new: int) -> list[int]:
    d, special = config["dims"], config["special_tokens"]
    src = np.array([ids], dtype=np.int64)
    src_mask = np.ones_like(src)
    names = [o.name for o in encoder.get_outputs() if o.name.startswith("cross.")]
    cross = dict(zip(names, encoder.run(names, {"input_ids": src, "attention_mask": src_mask}), strict=True))
    layers = d["n_decoder_layers"]
    past = {f"past_key_values.{i}.{k}": np.zeros((1, d["n_heads"], 0, d["d_head"]), np.float32)
            for i in range(layers) for k in ("key", "value")}
    token, out = special["bos"], []
    present_names = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    for step in range(max_new):
        feeds = {"input_ids": np.array([[token]], dtype=np.int64), "attention_mask": np.ones((1, step + 1), np.int64),
                 "position_ids": np.array([[step]], dtype=np.int64), "encoder_attention_mask": src_mask,
                 **cross, **past}
        logits, *presents = decoder.run(["logits", *present_names], feeds)
        token = int(logits[0, -1].argmax())
        if token == special["eos"]:
            break
        out.append(token)
        past = {name.replace("present", "past_key_values"): value
                for name, value in zip(present_names, presents, strict=True)}
    return out


def translator_bleu(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    import sacrebleu

    data, threads, sentences = args.data, args.threads, args.bleu_sentences
    config = json.loads((folder / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = [json.loads(line) for line in (data / "translation" / "test.jsonl").read_text().splitlines()][:sentences]
    out: dict[str, float] = {"sentences": len(rows)}
    for key in ("file", "int8_file"):
        enc, dec = (session(folder / config["graphs"][r][key], threads) for r in ("encoder", "decoder"))
        start = time.perf_counter()
        hyps = []
        for r in rows:
            ids = tokenizer.encode(r["src"]).ids
            hyps.append(tokenizer.decode(greedy_translate(enc, dec, config, ids, 2 * len(ids) + 10)))
        name = "fp32" if key == "file" else "int8"
        out[f"{name}_greedy_bleu"] = round(sacrebleu.corpus_bleu(hyps, [[r["tgt"] for r in rows]]).score, 2)
        out[f"{name}_seconds"] = round(time.perf_counter() - start, 2)
    return out


def generator_perplexity(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    from model.tasks.generation import load_stream

    data, threads, tokens = args.data, args.threads, args.ppl_tokens
    config = json.loads((folder / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stream = load_stream(tokenizer, data / "generation" / "test.txt", config["special_tokens"]["eos"])[: tokens + 1]
    d = config["dims"]
    window = config["max_positions"]
    out: dict[str, float] = {"tokens": tokens}
    for key in ("file", "int8_file"):
        sess = session(folder / config["graphs"]["decoder"][key], threads)
        nll, count = 0.0, 0
        for start in range(0, len(stream) - 1, window):
            chunk = stream[start : start + window + 1]
            n = len(chunk) - 1
            feeds = {"input_ids": chunk[None, :-1], "attention_mask": np.ones((1, n), np.int64),
                     "position_ids": np.arange(n, dtype=np.int64)[None],
                     **{f"past_key_values.{i}.{k}": np.zeros((1, d.get("n_kv_heads", d["n_heads"]), 0, d["d_head"]),
                                                             np.float32)
                        for i in range(d["n_layers"]) for k in ("key", "value")}}
            logits = sess.run(["logits"], feeds)[0][0].astype(np.float64)
            top = logits.max(-1, keepdims=True)
            log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
            nll -= float(log_probs[np.arange(n), chunk[1:]].sum())
            count += n
        out[f"{'fp32' if key == 'file' else 'int8'}_perplexity"] = round(math.exp(nll / count), 2)
    return out


@dataclass(frozen=True)
class GraphModel:
    """One artifact this benchmark measures: its decoder's cached step (if it decodes), its int8 quality."""

    int8_quality: Callable[[Path, argparse.Namespace], dict[str, float]]  # (its folder, the arguments)
    decoder: Decoder | None = None


GRAPH_MODELS = {
    "generator": GraphModel(generator_perplexity, Decoder("n_layers", no_feeds, generator_step)),
    "translator": GraphModel(translator_bleu, Decoder("n_decoder_layers", cross_feeds, translator_step)),
    "classifier": GraphModel(classifier_accuracy),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bleu-sentences", type=int, default=200)
    parser.add_argument("--ppl-tokens", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path("bench_results/export.json"))
    args = parser.parse_args()
    report: dict[str, dict[str, Any]] = {name: {} for name in GRAPH_MODELS}
    for name, model in GRAPH_MODELS.items():  # every decode step first, then the quality runs
        if model.decoder is not None:
            report[name]["decode_step"] = bench_decoder(args.artifacts / name, model.decoder, args.runs, args.threads)
    for name, model in GRAPH_MODELS.items():
        report[name]["int8_quality"] = model.int8_quality(args.artifacts / name, args)

    meta = {"threads": args.threads, "context": CONTEXT, "onnxruntime": ort.__version__, "torch": torch.__version__,
            "command": "python -m benchmarks.graphs " + f"--threads {args.threads}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, **report}, indent=2) + "\n")
    for name, sections in report.items():
        card_path = args.artifacts / name / "card.json"
        card = json.loads(card_path.read_text())
        card["export_report"] = {**sections, "meta": meta}
        card_path.write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
        for section, values in sections.items():
            print(f"\n{name} / {section}")
            for key, value in values.items():
                print(f"  {key:32s} {value}")


if __name__ == "__main__":
    main()
