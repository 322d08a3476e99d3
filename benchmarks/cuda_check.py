"""The CUDA path on a lent GPU: the provider really in use, the start-up checks, parity with the CPU, speed.

    python -m benchmarks.cuda_check artifacts/generator --out cuda_check.json

For a generator artifact, through the server's own runtime layer (service/runtime: provider selection,
GraphSession with IOBinding, the artifact's start-up checks against its golden outputs):

- which providers this onnxruntime build offers, and which one each session really runs on;
- the start-up checks (service/runtime/checks.py) passed on the CUDA sessions;
- parity: a batch of 16 prompts, prefill then 32 greedy steps with the KV cache kept on the GPU
  (IOBinding), against the same on the CPU: the largest logit difference and whether the tokens agree;
- speed: prefill and one decode step at batch 1 and 16, CPU (all cores) against CUDA, median of 20.

Also the parity of the translator (encoder, then the decoder fed the encoder's cross-attention K/V).
Parity is teacher-forced: the CUDA run is fed the CPU's greedy tokens, so every step compares logits on
the same inputs and the token agreement is the share of steps where both would pick the same token.

Prints a table and writes JSON. Exits 2 with a message where CUDA is not really used: this onnxruntime
has no CUDA provider (a CPU-only build once passed here silently with ``"cuda": false``), or a session
asked for it runs on another provider. benchmarks/gpu_check.py installs onnxruntime-gpu and runs this
with the real-size rows in one call.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from benchmarks import timing
from contract.names import ATTENTION_MASK, CROSS, ENCODER_ATTENTION_MASK, INPUT_IDS, LOGITS, POSITION_IDS, kv_names
from service.runtime.artifact import load_artifact
from service.runtime.checks import check_artifact
from service.runtime.sessions import CUDA, GraphSession, RuntimeOptions, Tensor, artifact_sessions, to_numpy

PROMPT_TOKENS, SOURCE_TOKENS, STEPS, REPEATS = 64, 24, 32, 20


def empty_past(session: GraphSession, batch: int) -> dict[str, np.ndarray]:
    """Zero-length past key/value inputs, shaped from the graph's own inputs."""
    past = {}
    for spec in session.spec.inputs:
        if spec.name.startswith("past_key_values."):
            heads, head_dim = spec.shape[1], spec.shape[3]
            past[spec.name] = np.zeros((batch, int(heads), 0, int(head_dim)), dtype=np.float32)
    return past


def greedy(session: GraphSession, prompts: np.ndarray, steps: int, extra: dict[str, Tensor] | None = None,
           forced: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Prefill then ``steps`` greedy steps, the KV cache fed back as the session keeps it (on the GPU under
    IOBinding). ``extra``: feeds of every step (a translator's cross-attention K/V and source mask).
    ``forced`` [batch, steps]: the tokens fed back instead of this session's own picks (teacher forcing).
    Returns the logits of every step and the tokens this session picked [batch, steps]."""
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
            **(extra or {}),
            **session.last_logits_only,
        }
        out = session.run(feeds, [LOGITS, *present_names], keep=present_names)
        logits = to_numpy(out[LOGITS])[:, -1]
        all_logits.append(logits)
        past = {name.replace("present.", "past_key_values."): out[name] for name in present_names}
        if step == steps:
            break
        picked = logits.argmax(-1).astype(np.int64)
        chosen.append(picked)
        ids = (picked if forced is None else forced[:, step]).astype(np.int64)[:, None]
        total += 1
    return all_logits, np.stack(chosen, axis=1)


def parity(cpu: GraphSession, gpu: GraphSession, prompts: np.ndarray, steps: int,
           extras: tuple[dict[str, Tensor], dict[str, Tensor]] = ({}, {})) -> dict[str, Any]:
    """The CPU's greedy run, and the device's fed the CPU's tokens: logits compared on the same inputs."""
    cpu_logits, cpu_tokens = greedy(cpu, prompts, steps, extras[0])
    gpu_logits, gpu_tokens = greedy(gpu, prompts, steps, extras[1], forced=cpu_tokens)
    diffs = [float(np.abs(c - g).max()) for c, g in zip(cpu_logits, gpu_logits, strict=True)]
    agree = cpu_tokens == gpu_tokens
    return {
        "max_abs_logit_diff": max(diffs), "prefill_max_abs_logit_diff": diffs[0],
        "mean_abs_logit": float(np.mean([np.abs(c).mean() for c in cpu_logits])),
        "greedy_token_agreement": float(agree.mean()),  # teacher-forced: same prefix, same pick
        "sequences_equal_share": float(agree.all(axis=1).mean()),  # whole greedy sequences the device repeats
        "batch": int(prompts.shape[0]), "prompt_tokens": int(prompts.shape[1]), "steps": steps,
    }


def cross_feeds(encoder: GraphSession, source: np.ndarray, layers: int) -> dict[str, Tensor]:
    """A translator decoder's feeds from the encoder: the source mask and the cross-attention K/V."""
    mask = np.ones_like(source)
    out = encoder.run({INPUT_IDS: source, ATTENTION_MASK: mask}, list(kv_names(CROSS, layers)))
    return {ENCODER_ATTENTION_MASK: mask, **{name: to_numpy(value) for name, value in out.items()}}


def artifact_parity(folder: Path, device: str = "cuda", batch: int = 16, steps: int = STEPS) -> dict[str, Any]:
    """A generator's or a translator's parity, CPU against ``device`` (with IOBinding), after the start-up
    checks (service/runtime/checks.py) pass on the device's sessions."""
    artifact = load_artifact(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cpu = artifact_sessions(folder.name, artifact.graphs, RuntimeOptions(device="cpu"))
    gpu = artifact_sessions(folder.name, artifact.graphs, RuntimeOptions(device=device, io_binding=True))
    check_artifact(artifact, gpu, tokenizer, max_input_tokens=256)  # raises on any mismatch
    rng = np.random.default_rng(0)
    record: dict[str, Any] = {"providers": {role: s.provider for role, s in gpu.items()}}
    if "encoder" not in artifact.graphs:
        prompts = rng.integers(10, artifact.vocab_size, (batch, PROMPT_TOKENS)).astype(np.int64)
        return record | parity(cpu["decoder"], gpu["decoder"], prompts, steps)
    source = rng.integers(10, artifact.vocab_size, (batch, SOURCE_TOKENS)).astype(np.int64)
    layers = artifact.n_decoder_layers
    extras = (cross_feeds(cpu["encoder"], source, layers), cross_feeds(gpu["encoder"], source, layers))
    start = np.full((batch, 1), artifact.special_tokens["bos"], dtype=np.int64)
    return record | parity(cpu["decoder"], gpu["decoder"], start, steps, extras) | {"source_tokens": SOURCE_TOKENS}


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
    if device == "cuda" and not record["cuda"]:
        return record
    record["parity"] = artifact_parity(folder, device)
    gpu_provider = record["parity"]["providers"]["decoder"]
    record["session_provider"], record["startup_checks"] = gpu_provider, f"passed on {gpu_provider}"
    artifact = load_artifact(folder)
    if "encoder" in artifact.graphs:  # speed: a generator's only
        return record
    cpu = artifact_sessions(folder.name, artifact.graphs, RuntimeOptions(device="cpu"))["decoder"]
    gpu = artifact_sessions(folder.name, artifact.graphs, RuntimeOptions(device=device, io_binding=True))["decoder"]
    record["io_binding"] = gpu.io_binding
    prompts = np.random.default_rng(0).integers(10, artifact.vocab_size, (16, PROMPT_TOKENS)).astype(np.int64)
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


def cuda_failure(record: dict[str, Any]) -> str | None:
    """Why a CUDA check did not run on CUDA, or None: the failure that must not exit 0."""
    if not record["cuda"]:
        return (f"onnxruntime {record['onnxruntime']} has no {CUDA} (providers: {record['available_providers']}): "
                "a CPU-only build; install onnxruntime-gpu (python -m benchmarks.gpu_check does)")
    used = record.get("session_provider")
    return None if used == CUDA else f"{CUDA} is listed but the session runs on {used}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path, default=Path("cuda_check.json"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test of this script")
    args = parser.parse_args()
    record = check(args.artifact, args.device)
    failure = cuda_failure(record) if args.device == "cuda" else None
    record["error"] = failure
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "speed_median_ms"}, indent=2))
    for device, timings in record.get("speed_median_ms", {}).items():
        print(f"{device:5s} " + "  ".join(f"{k} {v:7.2f}" for k, v in timings.items()))
    if failure:
        print(f"CUDA CHECK FAILED: {failure}", file=sys.stderr)
        raise SystemExit(2)  # never a silent pass


if __name__ == "__main__":
    main()
