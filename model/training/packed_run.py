"""A stable (wsd) run as one portable file: fp16 weights with the training state in the metadata.

It carries a run across machines: to and from a lent GPU (scripts/gpu_train.py), and across sessions,
committed beside the artifact (``committed_run``): the served graph holds the cooled-down weights (or, for
the classifier, the fine-tuned ones), and resuming the stable phase from those costs a re-warm-up (the
translator's validation loss went 2.63 -> 3.02 and was back to 2.78 only after 22 CPU-minutes).
Unpacked, it is a run folder that ``train`` resumes with a fresh optimizer.

    python -m model.training.packed_run runs/translator artifacts/translator/stable.safetensors
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def committed_run(artifact_dir: Path, kind: str) -> Path:
    from model.kinds import model_kind  # the kinds' records import the networks; a packed run needs none

    committed = model_kind(kind).committed_run
    if committed is None:
        raise ValueError(f"{kind} is not trained here: it has no committed run")
    return artifact_dir / committed


def pack_run(run_dir: Path, out: Path) -> None:
    """runs/<model>/last (+ resume state, config, tokenizer) -> one fp16 safetensors file with metadata."""
    weights = {k: v.half() if v.is_floating_point() else v for k, v in load_file(run_dir / "last.safetensors").items()}
    state = torch.load(run_dir / "resume.pt", weights_only=False)["state"]
    metadata = {"state": json.dumps(state), "config": (run_dir / "config.json").read_text(),
                "tokenizer": (run_dir / "tokenizer.json").read_text()}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, out, metadata=metadata)


def unpack_run(packed: Path, run_dir: Path) -> dict[str, Any]:
    """The inverse: a run folder that train() resumes (weights fp32, no optimizer state: a fresh one).
    Returns the training state (steps, minutes, segments, history)."""
    with safe_open(packed, "pt") as f:
        metadata = f.metadata()
    run_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.float() if v.is_floating_point() else v for k, v in load_file(packed).items()},
              run_dir / "last.safetensors")
    (run_dir / "config.json").write_text(metadata["config"])
    (run_dir / "tokenizer.json").write_text(metadata["tokenizer"])
    state = json.loads(metadata["state"])
    torch.save({"optimizer": None, "state": state}, run_dir / "resume.pt")
    return dict(state)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="pack a stable run folder into one fp16 safetensors file")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    pack_run(args.run_dir, args.out)
    print(f"{args.run_dir} -> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
