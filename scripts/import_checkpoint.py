"""Import a Hugging Face-format checkpoint folder into an artifact the server loads.

    python -m scripts.import_checkpoint DIR --out artifacts/NAME [--labels negative,positive]

DIR holds config.json, model.safetensors or pytorch_model.bin, and tokenizer files (tokenizer.json,
or a slow tokenizer that transformers converts). Families: BERT-architecture encoders (BERT, MiniLM;
with a sequence-classification head, or a base encoder whose head --labels names), GPT-2, Marian and
BART. The folder's name is the served model name; serve it with SERVE_MODELS=...,NAME.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

import torch

from model.hf_artifact import import_to_artifact
from model.hf_import import CheckpointError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="the checkpoint folder")
    parser.add_argument("--out", type=Path, required=True, help="artifact folder to write (its name is the model name)")
    parser.add_argument("--labels", help="comma-separated class names for a base encoder without a head")
    parser.add_argument("--license", help="license of the weights (default: read from the folder's README.md)")
    parser.add_argument("--no-int8", action="store_true", help="skip the dynamic-int8 graph variants")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    labels = [name.strip() for name in args.labels.split(",")] if args.labels else None
    command = "python -m scripts.import_checkpoint " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        card = import_to_artifact(args.checkpoint, args.out, args.out.name, labels, args.license,
                                  int8=not args.no_int8, command=command)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"artifact": str(args.out), "parity": card["parity"], "notes": card["notes"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
