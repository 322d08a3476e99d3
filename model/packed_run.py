"""A stable (wsd) run as one portable file: fp16 weights with the training state in the metadata.

It carries a run across machines: to and from a lent GPU (scripts/gpu_train.py), and across sessions
for a model whose served graph does not hold the weights that keep training (the classifier's MLM + NSP
encoder: its artifact holds the fine-tuned weights), committed as artifacts/classifier/pretrained.safetensors.
Unpacked, it is a run folder that ``train`` resumes with a fresh optimizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def pack_run(run_dir: Path, out: Path) -> None:
    """runs/<model>/last (+ resume state, config, tokenizer) -> one fp16 safetensors file with metadata."""
    weights = {k: v.half() if v.is_floating_point() else v for k, v in load_file(run_dir / "last.safetensors").items()}
    state = torch.load(run_dir / "resume.pt", weights_only=False)["state"]
    metadata = {"state": json.dumps(state), "config": (run_dir / "config.json").read_text(),
                "tokenizer": (run_dir / "tokenizer.json").read_text()}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, out, metadata=metadata)


def unpack_run(packed: Path, run_dir: Path) -> dict:
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
