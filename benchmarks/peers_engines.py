"""The rows of benchmarks/peers.py, and the peers that run in process: CTranslate2 and onnxruntime-genai.

    python -m benchmarks.peers_engines ENGINE MODEL_DIR '<json: {"rows": [...], "scale": s, "rounds": n,
                                                                 "threads": t, "vocab": v, "compute_type": c,
                                                                 "device": "cpu", "requests_factor": 1}>'

runs in the interpreter that has the engine (CTranslate2: .venv; onnxruntime-genai: .venv-peers) and prints one
JSON line: each row's measures, a list per round. This module imports nothing of the project's but numpy, so
that both venvs run it. Prompts are random token ids, a fresh one per request (no engine reuses a cached prefix).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FIRST_ID = 3  # ids below are the tokenizers' specials


@dataclass(frozen=True)
class Row:
    """One row of the table: `concurrency` requests at once (a batch, in process), `requests` in all."""

    name: str
    label: str
    prompt: int
    new_tokens: int
    concurrency: int
    requests: int
    measure: str  # "tokens_per_s", "prompt_tokens_per_s" or "streams" (decode tok/s per stream and TTFT)

    def scaled(self, scale: float) -> Row:
        def shrink(n: int, least: int) -> int:
            return max(least, round(n * scale))
        new = self.new_tokens if self.new_tokens == 1 else shrink(self.new_tokens, 4)
        return Row(self.name, self.label, shrink(self.prompt, 4), new, self.concurrency, self.requests, self.measure)


ROWS: dict[str, Row] = {r.name: r for r in (
    Row("c16", "16 concurrent, 64-token prompts, 128 new tokens (tok/s)", 64, 128, 16, 16, "tokens_per_s"),
    Row("single", "one at a time, 64-token prompt, 64 new tokens (tok/s)", 64, 64, 1, 2, "tokens_per_s"),
    Row("prefill256", "prompt processing, 256-token prompts (prompt tok/s)", 256, 1, 1, 2, "prompt_tokens_per_s"),
    Row("prefill1000", "prompt processing, 1,000-token prompts (prompt tok/s)", 1000, 1, 1, 2, "prompt_tokens_per_s"),
    Row("prefill2000", "prompt processing, 2,000-token prompts (prompt tok/s)", 2000, 1, 1, 2, "prompt_tokens_per_s"),
    Row("streams64", "4 streams at 64 prompt tokens, 96 new tokens", 64, 96, 4, 4, "streams"),
    Row("streams1500", "4 streams at 1,500 prompt tokens, 96 new tokens", 1500, 96, 4, 4, "streams"),
)}
# Encoders: `concurrency` is the batch of one request; requests are sent one at a time.
ENCODER_ROWS: dict[str, Row] = {r.name: r for r in (
    Row("emb1", "embeddings/s, batch 1 (32-token sentences)", 32, 0, 1, 16, "embeddings_per_s"),
    Row("emb32", "embeddings/s, batch 32 (32-token sentences)", 32, 0, 32, 4, "embeddings_per_s"),
)}
CLS, SEP = 2, 3  # BERT's ids in benchmarks/peers_models.py's word tokenizer


def prompts(row: Row, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.integers(FIRST_ID, vocab, row.prompt)] for _ in range(row.requests)]


def streams_summary(ttfts: list[float], rates: list[float]) -> dict[str, float]:
    """Medians over the streams: decode tok/s per stream (after its first token) and time to first token."""
    return {"decode_tokens_per_s_per_stream": round(float(np.median(rates)), 2),
            "ttft_s": round(float(np.median(ttfts)), 3)}


def stream_rate(tokens: int, first: float, last: float, with_first: int = 1) -> float:
    """Decode tok/s of one stream: the tokens after those that came with the first, over the time after it."""
    return (tokens - with_first) / (last - first) if tokens > with_first and last > first else 0.0


# --- in process: a batch of `concurrency` prompts per call ------------------------------------------------------

# A batch of prompts -> per prompt: (generated tokens, seconds to its first token, seconds to its last)
Batch = Callable[[list[list[int]], int], list[tuple[int, float, float]]]


def run_row(row: Row, batch: Batch, vocab: int, seed: int) -> dict[str, float]:
    items = prompts(row, vocab, seed)
    batch(items[:1], min(row.new_tokens, 2))  # warm-up
    results: list[tuple[int, float, float]] = []
    started = time.perf_counter()
    for i in range(0, len(items), row.concurrency):
        results += batch(items[i:i + row.concurrency], row.new_tokens)
    seconds = time.perf_counter() - started
    if row.measure == "tokens_per_s":
        return {"tokens_per_s": round(sum(r[0] for r in results) / seconds, 1)}
    if row.measure == "prompt_tokens_per_s":
        return {"prompt_tokens_per_s": round(row.prompt * len(items) / seconds, 1)}
    return streams_summary([r[1] for r in results], [stream_rate(n, a, b) for n, a, b in results])


def ct2_batch(model_dir: str, threads: int, compute_type: str, device: str = "cpu") -> Batch:
    import ctranslate2

    generator = ctranslate2.Generator(model_dir, device=device, intra_threads=threads, inter_threads=1,
                                      compute_type=compute_type)
    vocab: list[str] = json.loads(Path(model_dir, "vocabulary.json").read_text())

    def batch(items: list[list[int]], new_tokens: int) -> list[tuple[int, float, float]]:
        started = time.perf_counter()
        times: dict[int, list[float]] = {i: [] for i in range(len(items))}

        def step(result: Any) -> bool:
            times[result.batch_id].append(time.perf_counter() - started)
            return False

        generator.generate_batch([[vocab[i] for i in p] for p in items], max_length=new_tokens,
                                 min_length=new_tokens, include_prompt_in_result=False, beam_size=1,
                                 callback=step)
        return [(len(t), t[0], t[-1]) for t in times.values()]

    return batch


def genai_batch(model_dir: str) -> Batch:
    og: Any = importlib.import_module("onnxruntime_genai")  # in .venv-peers only
    model = og.Model(model_dir)

    def batch(items: list[list[int]], new_tokens: int) -> list[tuple[int, float, float]]:
        params = og.GeneratorParams(model)
        length = len(items[0]) + new_tokens
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=len(items))
        generator = og.Generator(model, params)
        started = time.perf_counter()
        generator.append_tokens(np.array(items, dtype=np.int32))  # the prompt's forward pass
        steps, first = 0, 0.0
        while not generator.is_done() and steps < new_tokens:
            generator.generate_next_token()  # picks a token (then runs it through the model, on the next call)
            steps += 1
            first = first or time.perf_counter() - started
        last = time.perf_counter() - started
        return [(steps, first, last)] * len(items)

    return batch


def ct2_encoder_rows(model_dir: str, spec: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """Embeddings/s: BertModel's last hidden state in CTranslate2, mean-pooled and normalised in numpy."""
    import ctranslate2

    encoder = ctranslate2.Encoder(model_dir, device="cpu", intra_threads=spec["threads"], inter_threads=1)
    out: dict[str, list[dict[str, float]]] = {}
    for round_ in range(spec["rounds"]):
        for name in spec["rows"]:
            row = ENCODER_ROWS[name]
            requests = max(2, round(row.requests * spec["scale"]))
            rng = np.random.default_rng(round_)
            batches = [[[CLS, *(int(i) for i in rng.integers(5, spec["vocab"], row.prompt)), SEP]
                        for _ in range(row.concurrency)] for _ in range(requests + 1)]

            def embed(batch: list[list[int]]) -> None:
                hidden = np.asarray(encoder.forward_batch(batch).last_hidden_state)
                pooled = hidden.mean(1)
                pooled /= np.linalg.norm(pooled, axis=-1, keepdims=True)

            embed(batches[0])  # warm-up
            started = time.perf_counter()
            for batch in batches[1:]:
                embed(batch)
            rate = row.concurrency * requests / (time.perf_counter() - started)
            out.setdefault(name, []).append({"embeddings_per_s": round(rate, 1)})
    return out


def main() -> None:
    engine, model_dir, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if engine == "ct2-encoder":
        print(json.dumps(ct2_encoder_rows(model_dir, spec)))
        return
    if engine == "ct2":
        batch = ct2_batch(model_dir, spec["threads"], spec["compute_type"], spec.get("device", "cpu"))
    elif engine == "genai":
        batch = genai_batch(model_dir)
    else:
        raise SystemExit(f"unknown engine {engine}")
    out: dict[str, list[dict[str, float]]] = {}
    for round_ in range(spec["rounds"]):
        for index, name in enumerate(spec["rows"]):
            row = ROWS[name].scaled(spec["scale"])
            # more requests per row where each takes milliseconds (a GPU): a longer, steadier timed window
            row = dataclasses.replace(row, requests=row.requests * spec.get("requests_factor", 1))
            out.setdefault(name, []).append(run_row(row, batch, spec["vocab"], seed=1000 * round_ + index))
            print(f"  {engine} {spec.get('compute_type', '')} round {round_ + 1} {name}: {out[name][-1]}",
                  file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
