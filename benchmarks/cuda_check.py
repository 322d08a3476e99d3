"""The CUDA path on a lent GPU: the provider really in use, the start-up checks, parity with the CPU, speed.

    python -m benchmarks.cuda_check artifacts/generator --out cuda_check.json

For a generator artifact, through the server's own runtime layer (service/runtime: provider selection,
GraphSession with IOBinding, the artifact's start-up checks against its golden outputs):

- which providers this onnxruntime build offers, and which one each session really runs on;
- the start-up checks (service/runtime/checks.py) passed on the CUDA sessions;
- parity: a batch of 16 prompts, prefill then 32 greedy steps with the KV cache kept on the GPU
  (IOBinding), against the same on the CPU: the largest logit difference and whether the tokens agree;
- speed: prefill and one decode step at batch 1 and 16, CPU (all cores) against CUDA, median of 20.

Prints a table and writes JSON. Exits 0 with ``"cuda": false`` where this onnxruntime has no CUDA
provider (the record then says so).
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from benchmarks import timing
from contract.names import ATTENTION_MASK, INPUT_IDS, LOGITS, POSITION_IDS
from service.runtime.artifact import load_artifact
from service.runtime.checks import check_artifact
from service.runtime.sessions import CUDA, GraphSession, RuntimeOptions, Tensor, artifact_sessions, to_numpy

PROMPT_TOKENS, STEPS, REPEATS = 64, 32, 20


def empty_past(session: GraphSession, batch: int) -> dict[str, np.ndarray]:
    """Zero-length past key/value inputs, shaped from the graph's own inputs."""
    past = {}
    for spec in session.spec.inputs:
        if spec.name.startswith("past_key_values."):
            heads, head_dim = spec.shape[1], spec.shape[3]
            past[spec.name] = np.zeros((batch, int(heads), 0, int(head_dim)), dtype=np.float32)
    return past


def greedy(session: GraphSession, prompts: np.ndarray, steps: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Prefill then ``steps`` greedy steps, the KV cache fed back as the session keeps it (on the GPU under
    IOBinding). Returns the logits of every step and the chosen tokens [batch, steps]."""
    batch, width = prompts.shape
    present_names = [n for n in session.output_names if n.startswith("present.")]
    past: dict[str, Tensor] = dict(empty_past(session, batch))
    ids, total, chosen, all_logits = prompts, width, [], []
    for step in range(steps + 1):
        seq = ids.shape[1]
        feeds: dict[str, Tensor] = {
            INPUT_IDS: ids,
            ATTENTION_MASK: np.ones((batch, total), dtype=np.int64),
            POSITION_IDS: np.broadcast_to(np.arange(total - seq, total, dtype=np.int64), (batch, seq)).copy(),
            **past,
            **session.last_logits_only,
        }
        out = session.run(feeds, [LOGITS, *present_names], keep=present_names)
        logits = to_numpy(out[LOGITS])[:, -1]
        all_logits.append(logits)
        past = {name.replace("present.", "past_key_values."): out[name] for name in present_names}
        if step == steps:
            break
        ids = logits.argmax(-1).astype(np.int64)[:, None]
        chosen.append(ids[:, 0])
        total += 1
    return all_logits, np.stack(chosen, axis=1)


def median_ms(fn: Callable[[], Any]) -> float:
    """After one untimed call (CUDA: kernels chosen, memory arena grown), the median of REPEATS."""
    return timing.median_ms(fn, REPEATS)


def step_timer(session: GraphSession, batch: int, past_len: int) -> Callable[[], Any]:
    """One decode step at ``past_len`` cached positions, the cache already where the session keeps it."""
    present_names = [n for n in session.output_names if n.startswith("present.")]
    past = {name.replace("present.", "past_key_values."): session.place(np.random.default_rng(0).standard_normal(
        (batch, int(spec.shape[1]), past_len, int(spec.shape[3]))).astype(np.float32))
            for name, spec in ((n, next(s for s in session.spec.inputs
                                        if s.name == n.replace("present.", "past_key_values.")))
                               for n in present_names)}
    feeds: dict[str, Tensor] = {INPUT_IDS: np.ones((batch, 1), dtype=np.int64),
                                ATTENTION_MASK: np.ones((batch, past_len + 1), dtype=np.int64),
                                POSITION_IDS: np.full((batch, 1), past_len, dtype=np.int64), **past,
                                **session.last_logits_only}
    return lambda: session.run(feeds, [LOGITS, *present_names], keep=present_names)


def prefill_timer(session: GraphSession, prompts: np.ndarray) -> Callable[[], Any]:
    batch, width = prompts.shape
    feeds: dict[str, Tensor] = {INPUT_IDS: prompts, ATTENTION_MASK: np.ones((batch, width), dtype=np.int64),
                                POSITION_IDS: np.broadcast_to(np.arange(width, dtype=np.int64), (batch, width)).copy(),
                                **empty_past(session, batch), **session.last_logits_only}
    return lambda: session.run(feeds, [LOGITS])


def check(folder: Path, device: str = "cuda") -> dict[str, Any]:
    """``device`` "cpu": the same measurements with IOBinding on the CPU (the script's own smoke test)."""
    record: dict[str, Any] = {"artifact": str(folder), "onnxruntime": ort.__version__,
                              "available_providers": ort.get_available_providers(), "host": platform.node()}
    record["cuda"] = CUDA in record["available_providers"]
    artifact = load_artifact(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cpu = artifact_sessions(folder.name, artifact.graphs, RuntimeOptions(device="cpu"))["decoder"]
    if device == "cuda" and not record["cuda"]:
        return record
    sessions = artifact_sessions(folder.name, artifact.graphs, RuntimeOptions(device=device, io_binding=True))
    gpu = sessions["decoder"]
    record["session_provider"], record["io_binding"] = gpu.provider, gpu.io_binding
    check_artifact(artifact, sessions, tokenizer, max_input_tokens=256)  # raises on any mismatch
    record["startup_checks"] = f"passed on {gpu.provider}"

    vocab = artifact.vocab_size
    prompts = np.random.default_rng(0).integers(10, vocab, (16, PROMPT_TOKENS)).astype(np.int64)
    cpu_logits, cpu_tokens = greedy(cpu, prompts, STEPS)
    gpu_logits, gpu_tokens = greedy(gpu, prompts, STEPS)
    step_diffs = (np.abs(c - g).max() for c, g in zip(cpu_logits, gpu_logits, strict=True))
    record["parity"] = {
        "prefill_max_abs_logit_diff": float(np.abs(cpu_logits[0] - gpu_logits[0]).max()),
        "steps_max_abs_logit_diff": float(max(step_diffs)),
        "greedy_tokens_equal": bool((cpu_tokens == gpu_tokens).all()),
        "greedy_tokens_agreeing_share": float((cpu_tokens == gpu_tokens).mean()),
        "batch": 16, "prompt_tokens": PROMPT_TOKENS, "steps": STEPS,
    }
    speed: dict[str, dict[str, float]] = {}
    for name, session in (("cpu", cpu), (device, gpu)):
        speed[name] = {
            "prefill_b1_ms": median_ms(prefill_timer(session, prompts[:1])),
            "prefill_b16_ms": median_ms(prefill_timer(session, prompts)),
            "step_b1_past128_ms": median_ms(step_timer(session, 1, 128)),
            "step_b16_past128_ms": median_ms(step_timer(session, 16, 128)),
        }
    record["speed_median_ms"] = speed
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path, default=Path("cuda_check.json"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test of this script")
    args = parser.parse_args()
    record = check(args.artifact, args.device)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "speed_median_ms"}, indent=2))
    for device, timings in record.get("speed_median_ms", {}).items():
        print(f"{device:5s} " + "  ".join(f"{k} {v:7.2f}" for k, v in timings.items()))


if __name__ == "__main__":
    main()
