"""Model cards state what a model is for: write_card writes the intended-use record of model/training/intended_use.py
into card.json and card.md, and refresh_card (what the export calls) adds the served model's answers."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from contract.cards import use_summary
from model.importing.hf_artifact import write_card as write_import_card
from model.training.card import write_card
from model.training.intended_use import RECORDS
from scripts.card_examples import refresh_card


def trained_card(name: str) -> dict[str, Any]:
    return {"model": name, "summary": "a test model.", "parameters": 1234, "config": {},
            "data": {"description": "test data", "license": "public domain"},
            "training": {"minutes": 1.0, "steps": 10, "hardware": "a CPU"}, "metrics": {"val_loss": 1.5}}


def test_write_card_writes_intended_use_sections(tmp_path: Path) -> None:
    card = trained_card("generator") | {"out_of_domain_examples": [
        {"input": "a | b", "output": "line one\nline two", "note": "a note"}], "out_of_domain_examples_how": "asked."}
    write_card(tmp_path, card)
    written = json.loads((tmp_path / "card.json").read_text())
    record = RECORDS["generator"]
    assert written["intended_use"] == record.intended_use
    assert written["domains"] == list(record.domains) and written["out_of_scope"] == list(record.out_of_scope)
    assert list(written)[:5] == ["model", "summary", "intended_use", "domains", "out_of_scope"]
    assert written["out_of_domain_examples"] == card["out_of_domain_examples"]  # kept as given
    md = (tmp_path / "card.md").read_text()
    assert "| val_loss | 1.5 |" in md  # the table is still there, the sections follow it
    use = md[md.index("## Intended use"):]
    assert "Continuing English text in the style of US presidential State of the Union addresses" in use
    assert all(f"- {d}" in use for d in record.domains) and all(f"- {o}" in use for o in record.out_of_scope)
    assert "## Outside the training domains" in use and "asked." in use
    assert "| a \\| b | line one line two | a note |" in use  # one table row each, pipes escaped


def test_cards_without_a_record_are_left_alone(tmp_path: Path) -> None:
    write_card(tmp_path, trained_card("someone-elses-model"))
    assert "intended_use" not in json.loads((tmp_path / "card.json").read_text())
    assert "## Intended use" not in (tmp_path / "card.md").read_text()


def test_imported_card_writes_the_sections_it_has(tmp_path: Path) -> None:
    record = RECORDS["classifier-minilm"]
    card = {"model": "classifier-minilm", "summary": "imported.", "parameters": 5,
            "source": {"origin": "hub", "license": "apache-2.0", "command": "python -m x"}, "metrics": {},
            "intended_use": record.intended_use, "domains": list(record.domains), "out_of_scope": []}
    write_import_card(tmp_path, card)
    md = (tmp_path / "card.md").read_text()
    assert "## Intended use" in md and "| weights from | hub |" in md
    assert use_summary(card) == f"{record.intended_use}; trained on {record.domains[0]} and {record.domains[1]}."


@pytest.mark.parametrize("name", ["translator", "generator", "classifier"])
def test_refresh_card_asks_the_served_model(name: str, tiny_artifacts: Path, tmp_path: Path) -> None:
    """What the export does after writing an artifact: the probes go through the server's routes and
    their answers, the intended use and card.md's sections are written; an untrained card is left alone."""
    folder = tmp_path / name
    shutil.copytree(tiny_artifacts / name, folder)
    untrained = (folder / "card.json").read_text()
    assert refresh_card(folder, threads=1) is None and (folder / "card.json").read_text() == untrained
    (folder / "card.json").write_text(json.dumps(trained_card(name)))
    card = refresh_card(folder, threads=1)
    assert card is not None and json.loads((folder / "card.json").read_text()) == card
    probes = RECORDS[name].probes
    assert [e["input"] for e in card["out_of_domain_examples"]] == [p.input for p in probes]
    assert [e["note"] for e in card["out_of_domain_examples"]] == [p.note for p in probes]
    assert all(isinstance(e["output"], str) for e in card["out_of_domain_examples"])
    if name == "classifier":
        assert all(e["output"].split()[0] in ("negative", "positive") for e in card["out_of_domain_examples"])
    assert "python -m scripts.card_examples" in card["out_of_domain_examples_how"]
    assert card["intended_use"] == RECORDS[name].intended_use
    assert "## Outside the training domains" in (folder / "card.md").read_text()
