"""English->French pairs: Bible verses (WEB and Basic English -> Segond) plus gettext UI strings.

The Bible is split by book, so parallel passages cannot leak between splits.
Valid and test use World English only (one reference per verse); the Basic
English test pairs go to ``test_bbe``. Clean gettext pairs go to train, except
a held-out ``test_gettext`` set. The registry sources of ``model/data/parallel_sources.py``
(LibreOffice, Debian applications, games) are appended to train after those rows, each with
its own held-out ``test_<source>``; the Bible and gettext splits do not depend on them.
"""

from __future__ import annotations

import random
import re
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from model.data import normalize_text, write_jsonl

TARGET_VERSION = "l"  # Louis Segond 1910
SOURCE_VERSIONS = {"web": "4", "bbe": "3"}  # World English Bible, Bible in Basic English
NAME_VERSION = "4"  # book names are taken from the WEB rows of bibleRef
TEST_BOOKS = frozenset({"Ruth", "Ecclesiastes", "Jonah", "Habakkuk", "Philippians", "1John"})
VALID_BOOKS = frozenset({"Joel", "Obadiah", "Titus", "Jude"})
SPLITS = ("train", "valid", "test", "test_bbe", "test_gettext")
GETTEXT_TEST_SIZE = 500
GETTEXT_WORDS = (5, 20)

_BRACKETS = re.compile(r"[\[\]]")
_VERSE_REF = re.compile(r"\(\d+:\d+\)")  # Segond's "(9:1)" verse numbers inside Psalms
_ELLIPSIS_STARS = re.compile(r"\*+")  # Basic English marks untranslatable text with ***
_GETTEXT_MARKUP = re.compile(r"[%_&{}<>\\|$@=#^~]|--|\.\.\.|\s{2}")


def clean_verse(text: str) -> str:
    """Remove markup from a verse; keep the words the translators supplied in brackets.

    WEB brackets supplied words ("[who is] Gideon"), whose removal would break
    the sentence (Segond renders them), so only the brackets go; a verse that
    is just "[]" becomes empty. Also drops Segond's "(9:1)" verse numbers and
    Basic English's "***", and turns WEB's backtick apostrophe into "'".
    """
    text = _VERSE_REF.sub(" ", text)
    text = _ELLIPSIS_STARS.sub(" ", _BRACKETS.sub("", text)).replace("`", "'")
    return re.sub(r"\s+([,;:.!?])", r"\1", normalize_text(text))  # no space left before punctuation


def book_split(book: str) -> str:
    """Which split a Bible book belongs to."""
    return "test" if book in TEST_BOOKS else "valid" if book in VALID_BOOKS else "train"


def read_bible_pairs(db_path: Path, source: str) -> list[dict[str, Any]]:
    """Aligned (source version, Segond) verses in canonical order, empty ones dropped."""
    query = """
        SELECT r.bName, s.vText, t.vText FROM bible s
        JOIN bible t ON t.bbName = ? AND (t.bNumber, t.cNumber, t.vNumber) = (s.bNumber, s.cNumber, s.vNumber)
        JOIN bibleRef r ON r.bbName = ? AND r.bNumber = s.bNumber
        WHERE s.bbName = ? ORDER BY s.bNumber, s.cNumber, s.vNumber
    """
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute(query, (TARGET_VERSION, NAME_VERSION, SOURCE_VERSIONS[source])).fetchall()
    books = {book for book, _, _ in rows}
    missing = (TEST_BOOKS | VALID_BOOKS) - books
    if missing:
        raise ValueError(f"books not in {db_path}: {sorted(missing)}")
    pairs = ({"src": clean_verse(s), "tgt": clean_verse(t), "book": book, "source": source} for book, s, t in rows)
    return [p for p in pairs if p["src"] and p["tgt"]]


def split_bible(pairs: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Route pairs by book: WEB to train/valid/test, Basic English to train/test_bbe (not valid)."""
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name in ("train", "valid", "test", "test_bbe")}
    for pair in pairs:
        split = book_split(pair["book"])
        if pair["source"] == "bbe" and split != "train":
            if split == "test":
                splits["test_bbe"].append(pair)
            continue
        splits[split].append(pair)
    return splits


def clean_gettext_pair(msgid: str, msgstr: str) -> tuple[str, str] | None:
    """A clean 5-20-word single-line pair without placeholders or accelerators, else None."""
    if _GETTEXT_MARKUP.search(msgid) or _GETTEXT_MARKUP.search(msgstr) or "\n" in msgid + msgstr:
        return None
    src, tgt = normalize_text(msgid), normalize_text(msgstr)
    low, high = GETTEXT_WORDS
    if not low <= len(src.split()) <= high or src.lower() == tgt.lower() or not src[0].isalpha():
        return None
    return src, tgt


def gettext_pairs(entries: Iterable[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Clean gettext (domain, msgid, msgstr) entries, deduplicated on the case-folded source."""
    seen: set[str] = set()
    pairs = []
    for domain, msgid, msgstr in sorted(entries):
        cleaned = clean_gettext_pair(msgid, msgstr)
        if cleaned is None:
            continue
        key = cleaned[0].casefold().rstrip(".!?:; ")
        if key not in seen:
            seen.add(key)
            pairs.append({"src": cleaned[0], "tgt": cleaned[1], "book": domain, "source": "gettext"})
    return pairs


def build_translation(db_path: Path, gettext_entries: Iterable[tuple[str, str, str]],
                      out_dir: Path, seed: int = 0,
                      parallel: Mapping[str, Iterable[tuple[str, str, str]]] | None = None) -> dict[str, dict[str, int]]:
    """Write ``{train,valid,test,test_bbe,test_gettext}.jsonl``; return pair counts per file.

    ``parallel`` ({source: (catalog, msgid, msgstr) triples}, see ``parallel_sources``) adds its
    cleaned pairs at the end of train and writes ``test_<source>.jsonl``; every English string
    of the Bible and gettext splits is excluded from them, and those splits stay as they were.
    """
    splits = split_bible(p for source in SOURCE_VERSIONS for p in read_bible_pairs(db_path, source))
    extra = gettext_pairs(gettext_entries)
    random.Random(seed).shuffle(extra)
    splits["test_gettext"] = extra[:GETTEXT_TEST_SIZE]
    splits["train"] += extra[GETTEXT_TEST_SIZE:]
    names = list(SPLITS)
    if parallel:
        from model.data.parallel_sources import parallel_splits

        existing = [pair["src"] for name in SPLITS for pair in splits[name]]
        new_splits, stats = parallel_splits(parallel, existing)
        splits["train"] += new_splits.pop("train")
        splits |= new_splits
        names += list(new_splits)
    counts = {f"{name}.jsonl": {"pairs": write_jsonl(out_dir / f"{name}.jsonl", splits[name])} for name in names}
    if parallel:  # each held-out file also records its source's catalog entries, clean pairs and train pairs
        for source, stat in stats.items():
            counts[f"test_{source}.jsonl"] |= {"source_entries": stat["entries"], "source_clean": stat["clean"],
                                               "source_kept": stat["kept"], "source_train": stat["train"]}
    return counts
