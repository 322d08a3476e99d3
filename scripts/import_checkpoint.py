"""Import a Hugging Face-format checkpoint folder into an artifact the server loads.

    python -m scripts.import_checkpoint DIR --out artifacts/NAME [--random-head negative,positive] [--quantize int4]

DIR holds config.json, model.safetensors or pytorch_model.bin, and tokenizer files (tokenizer.json,
or a slow tokenizer that transformers converts). Families: every model_type of model/families/, listed
below (the Llama-shaped decoders' generation_config.json too: docs/decoders.md). config.json's sizes
must be the ones the weights hold; a computed position limit (rotary, sinusoids, T5) past the cap of
model/families/dims.py is lowered to it, and the card says so. An encoder imports as:

- a classifier when it has a trained sequence-classification head (a cross-encoder with one label too:
  its one logit is a relevance score);
- an embedder when it is a sentence-transformers folder (modules.json: pooling from 1_Pooling/config.json,
  normalisation when a Normalize module follows, max_seq_length from sentence_bert_config.json), or when
  it has no trained head (mean pooling, not normalised; the output says so);
- a classifier with a random head only when --random-head names its classes (for fine-tuning; a warning
  is printed, and its scores mean nothing until then).

--quantize int8|int4 stores every MatMul weight as int8 or int4 blocks (model/export/quantize.py) in the graphs
the server loads; the card states the precision and its cost against the fp32 export (model/importing/quantized.py).

The folder's name is the served model name; serve it with SERVE_MODELS=...,NAME.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

import torch

from model.export.quantize import PRECISIONS
from model.families import FAMILIES
from model.importing.hf_artifact import import_to_artifact
from model.importing.hf_chat_template import find_chat_template, template_tokens
from model.importing.hf_import import CheckpointError
from service.engine.tasks.generation.chat_template import TemplateBoundsError, check_template_source


def check_chat_template(checkpoint: Path) -> None:
    """The checkpoint's chat template, if any, must compile and render sample conversations within the
    server's bounds (service/engine/tasks/generation/template_sandbox.py): else a CheckpointError, as the
    server would exit."""
    template = find_chat_template(checkpoint)
    if template is None:
        return
    try:
        check_template_source(template, template_tokens(checkpoint))
    except TemplateBoundsError as exc:
        raise CheckpointError(f"{checkpoint}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    families = "".join(f"\n  {name:<12} {family.reference_class(True)}" for name, family in FAMILIES.items())
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"families (config.json model_type, transformers class):{families}")
    parser.add_argument("checkpoint", type=Path, help="the checkpoint folder")
    parser.add_argument("--out", type=Path, required=True, help="artifact folder to write (its name is the model name)")
    parser.add_argument("--random-head", "--labels", dest="random_head", metavar="LABELS",
                        help="comma-separated class names of a random classification head for an encoder without a "
                             "trained one (to fine-tune); without it such an encoder imports as an embedder")
    parser.add_argument("--license", help="license of the weights (default: read from the folder's README.md)")
    parser.add_argument("--no-int8", action="store_true", help="skip the dynamic-int8 graph variants")
    parser.add_argument("--quantize", choices=["fp32", *PRECISIONS], default="fp32",
                        help="weights of the served graphs: fp32 (stored as fp16; default), or int8 / int4 blocks "
                             "(MatMulNBits), the cost against fp32 measured into the card")
    parser.add_argument("--kv-cache", choices=["in-place", "appended"], default="in-place",
                        help="a decoder's cache: written in place by its graph (default: no copy per step, long "
                             "contexts) or appended to and returned (each step copies it; attention maps served)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    labels = [name.strip() for name in args.random_head.split(",")] if args.random_head else None
    command = "python -m scripts.import_checkpoint " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        check_chat_template(args.checkpoint)  # before the import's minutes of work
        card = import_to_artifact(args.checkpoint, args.out, args.out.name, labels, args.license,
                                  int8=not args.no_int8, command=command,
                                  quantize=None if args.quantize == "fp32" else args.quantize, kv_cache=args.kv_cache)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in card["notes"]:
        if note.startswith("WARNING"):
            print(note, file=sys.stderr)
    task = json.loads((args.out / "config.json").read_text())["task"]
    summary = {"artifact": str(args.out), "task": task, "parity": card["parity"], "notes": card["notes"]}
    if "quantization" in card:
        summary["quantization"] = card["quantization"]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
