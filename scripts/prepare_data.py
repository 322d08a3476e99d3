"""Fetch the raw corpora, build every split, train the three tokenizers, write the manifest.

    python -m scripts.prepare_data [--data-dir data] [--tasks translation,generation,classification]
    python -m scripts.prepare_data --tasks translation --keep-tokenizers translator   # translation data only
    python -m scripts.prepare_data --tasks classification --keep-tokenizers classifier  # a new corpus for a
                                                                  # run that resumes with its own tokenizer


Outputs under the data dir: ``raw/``, ``translation/``, ``generation/``,
``classification/``, ``tokenizers/{translator,generator,classifier}.json`` and
``manifest.json`` (sha256 and counts of every archive and produced file).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from model.data import file_entry
from model.data.classification import bbc_documents, build_classification, dialog_documents, split_sentences
from model.data.fetch import GETTEXT_DIR, fetch_all, read_gettext_catalogs, update_manifest
from model.data.generation import build_generation, read_documents
from model.data.parallel_sources import PARALLEL_SOURCES, read_source
from model.data.translation import build_translation
from model.data.unlabeled_english import unlabeled_documents
from model.kinds import TRAINABLE, model_kind
from model.training.tokenization import DEFAULT_VOCAB_SIZE

Counts = dict[str, dict[str, int]]  # written file -> its counts (the manifest records them)


def train_tokenizer(kind: str, data_dir: Path, vocab_size: int, manifest: Path) -> None:
    """Train one tokenizer, save ``tokenizers/<kind>.json`` and record it."""
    path = data_dir / "tokenizers" / f"{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = model_kind(kind)
    trainer, texts = record.train_tokenizer, record.tokenizer_texts
    assert trainer is not None and texts is not None, f"{kind} has no tokenizer trained here"
    tokenizer = trainer(texts(data_dir), vocab_size)
    tokenizer.save(str(path))
    entry = file_entry(path, vocab_size=tokenizer.get_vocab_size())
    update_manifest(manifest, "tokenizers", {f"tokenizers/{kind}.json": entry})
    print(f"tokenizer {kind}: vocab {tokenizer.get_vocab_size()} -> {path}")


def record_splits(manifest: Path, data_dir: Path, task: str, counts: dict[str, dict[str, int]]) -> None:
    """Add the sha256 and counts of each written file of one task to the manifest."""
    entries = {f"{task}/{name}": file_entry(data_dir / task / name, **count) for name, count in counts.items()}
    update_manifest(manifest, "splits", entries)
    print(f"{task}: {json.dumps(counts)}")


def build_translation_data(args: argparse.Namespace, manifest: Path) -> Counts:
    """The gettext catalogs and the pinned parallel sources recorded, then the translation splits."""
    raw = args.data_dir / "raw"
    entries, catalogs = read_gettext_catalogs(args.gettext_dir)
    update_manifest(manifest, "gettext", catalogs)
    parallel = {}
    for name in PARALLEL_SOURCES:
        parallel[name], entry = read_source(name, raw / "archives")
        update_manifest(manifest, "parallel", {name: entry})
    return build_translation(raw / "bible" / "bible.db", entries, args.data_dir / "translation", parallel=parallel)


def build_generation_data(args: argparse.Namespace, manifest: Path) -> Counts:
    return build_generation(args.data_dir / "raw" / "sotu", args.data_dir / "generation")


def build_classification_data(args: argparse.Namespace, manifest: Path) -> Counts:
    """The labelled splits, and the pretraining corpus from dialogs, the generation train split's speeches
    (built before, by this run or an earlier one), BBC news and the unlabeled English of
    model/data/unlabeled_english.py."""
    data_dir, raw = args.data_dir, args.data_dir / "raw"
    speeches = [[s for p in d.split("\n") for s in split_sentences(p)]
                for d in read_documents(data_dir / "generation" / "train.txt")]
    extra_documents = dialog_documents(raw / "dialog" / "moviedialog.csv") + speeches + bbc_documents(raw / "bbc")
    return build_classification(raw / "hutto", data_dir / "classification", extra_documents + unlabeled_documents(raw))


@dataclass(frozen=True)
class DataTask:
    """One --tasks name: what builds data/<name>/, and the model kind whose tokenizer then trains on it."""

    name: str
    build: Callable[[argparse.Namespace, Path], Counts]  # (args, manifest) -> counts per written file
    kind: str


DATA_TASKS = (  # in this order: classification reads the generation train split
    DataTask("translation", build_translation_data, "translator"),
    DataTask("generation", build_generation_data, "generator"),
    DataTask("classification", build_classification_data, "classifier"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--gettext-dir", type=Path, default=GETTEXT_DIR)
    parser.add_argument("--tasks", default=",".join(task.name for task in DATA_TASKS),
                        help="which data to build (comma-separated); the pinned archives are fetched in any case")
    parser.add_argument("--keep-tokenizers", default="", metavar="KINDS",
                        help="comma-separated kinds whose data/tokenizers/<kind>.json stays as it is")
    for kind in TRAINABLE:
        parser.add_argument(f"--{kind}-vocab", type=int, default=DEFAULT_VOCAB_SIZE)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    data_dir = args.data_dir
    manifest = data_dir / "manifest.json"
    tasks = set(args.tasks.split(","))
    kept = set(filter(None, args.keep_tokenizers.split(",")))  # tokenizers left as they are

    update_manifest(manifest, "archives", fetch_all(data_dir / "raw"))
    for task in DATA_TASKS:
        if task.name not in tasks:
            continue
        record_splits(manifest, data_dir, task.name, task.build(args, manifest))
        if task.kind not in kept:
            train_tokenizer(task.kind, data_dir, getattr(args, f"{task.kind}_vocab"), manifest)
    print(f"manifest -> {manifest}")


if __name__ == "__main__":
    main()
