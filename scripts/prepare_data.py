"""Fetch the raw corpora, build every split, train the three tokenizers, write the manifest.

    python -m scripts.prepare_data [--data-dir data] [--tasks translation,generation,classification]
    python -m scripts.prepare_data --tasks translation --no-translator-tokenizer   # translation data only


Outputs under the data dir: ``raw/``, ``translation/``, ``generation/``,
``classification/``, ``tokenizers/{translator,generator,classifier}.json`` and
``manifest.json`` (sha256 and counts of every archive and produced file).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from model.data import file_entry, read_jsonl
from model.data.classification import bbc_documents, build_classification, dialog_documents, split_sentences
from model.data.fetch import GETTEXT_DIR, fetch_all, read_gettext_catalogs, update_manifest
from model.data.generation import build_generation, read_documents
from model.data.parallel_sources import PARALLEL_SOURCES, read_source
from model.data.translation import build_translation
from model.kinds import TRAINABLE, model_kind
from model.training.tokenization import DEFAULT_VOCAB_SIZE


def translator_texts(data_dir: Path) -> Iterator[str]:
    """Each distinct English and French text of the translation train split's Bible and gettext rows.

    The registry sources (``parallel_sources``) are left out, so the translator's tokenizer is the
    one it was before they were added (the committed translator reuses it).
    """
    seen: set[str] = set()
    for pair in read_jsonl(data_dir / "translation" / "train.jsonl"):
        if pair.get("source") in PARALLEL_SOURCES:
            continue
        for text in (pair["src"], pair["tgt"]):
            if text not in seen:
                seen.add(text)
                yield text


def pretrain_lines(data_dir: Path) -> Iterator[str]:
    """Non-empty lines of the classifier's pretraining corpus (it holds the train snippets)."""
    with (data_dir / "classification" / "pretrain.txt").open(encoding="utf-8") as f:
        yield from (line.rstrip("\n") for line in f if line.strip())


def tokenizer_texts(kind: str, data_dir: Path) -> Iterator[str]:
    """Training texts for one tokenizer kind: train splits only."""
    if kind == "translator":
        return translator_texts(data_dir)
    if kind == "generator":
        return iter(read_documents(data_dir / "generation" / "train.txt"))
    return pretrain_lines(data_dir)


def train_tokenizer(kind: str, data_dir: Path, vocab_size: int, manifest: Path) -> None:
    """Train one tokenizer, save ``tokenizers/<kind>.json`` and record it."""
    path = data_dir / "tokenizers" / f"{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer = model_kind(kind).train_tokenizer
    assert trainer is not None, f"{kind} has no tokenizer trained here"
    tokenizer = trainer(tokenizer_texts(kind, data_dir), vocab_size)
    tokenizer.save(str(path))
    entry = file_entry(path, vocab_size=tokenizer.get_vocab_size())
    update_manifest(manifest, "tokenizers", {f"tokenizers/{kind}.json": entry})
    print(f"tokenizer {kind}: vocab {tokenizer.get_vocab_size()} -> {path}")


def record_splits(manifest: Path, data_dir: Path, task: str, counts: dict[str, dict[str, int]]) -> None:
    """Add the sha256 and counts of each written file of one task to the manifest."""
    entries = {f"{task}/{name}": file_entry(data_dir / task / name, **count) for name, count in counts.items()}
    update_manifest(manifest, "splits", entries)
    print(f"{task}: {json.dumps(counts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--gettext-dir", type=Path, default=GETTEXT_DIR)
    parser.add_argument("--tasks", default="translation,generation,classification",
                        help="which data to build (comma-separated); the pinned archives are fetched in any case")
    parser.add_argument("--no-translator-tokenizer", action="store_true",
                        help="keep data/tokenizers/translator.json as it is")
    for kind in TRAINABLE:
        parser.add_argument(f"--{kind}-vocab", type=int, default=DEFAULT_VOCAB_SIZE)
    args = parser.parse_args()
    data_dir, raw = args.data_dir, args.data_dir / "raw"
    manifest = data_dir / "manifest.json"

    tasks = set(args.tasks.split(","))

    update_manifest(manifest, "archives", fetch_all(raw))
    if "translation" in tasks:
        entries, catalogs = read_gettext_catalogs(args.gettext_dir)
        update_manifest(manifest, "gettext", catalogs)
        parallel = {}
        for name in PARALLEL_SOURCES:
            parallel[name], entry = read_source(name, raw / "archives")
            update_manifest(manifest, "parallel", {name: entry})
        counts = build_translation(raw / "bible" / "bible.db", entries, data_dir / "translation", parallel=parallel)
        record_splits(manifest, data_dir, "translation", counts)
        if not args.no_translator_tokenizer:
            train_tokenizer("translator", data_dir, args.translator_vocab, manifest)

    if "generation" in tasks:
        record_splits(manifest, data_dir, "generation", build_generation(raw / "sotu", data_dir / "generation"))
        train_tokenizer("generator", data_dir, args.generator_vocab, manifest)
    if "classification" not in tasks:
        print(f"manifest -> {manifest}")
        return

    speeches = [[s for p in d.split("\n") for s in split_sentences(p)]
                for d in read_documents(data_dir / "generation" / "train.txt")]
    extra_documents = dialog_documents(raw / "dialog" / "moviedialog.csv") + speeches + bbc_documents(raw / "bbc")
    counts = build_classification(raw / "hutto", data_dir / "classification", extra_documents)
    record_splits(manifest, data_dir, "classification", counts)
    train_tokenizer("classifier", data_dir, args.classifier_vocab, manifest)
    print(f"manifest -> {manifest}")


if __name__ == "__main__":
    main()
