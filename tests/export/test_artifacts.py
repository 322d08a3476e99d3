"""The committed artifacts, checked with ONNX Runtime alone (no torch import here, as in the server).

A broken, stale or half-committed artifact folder fails this test: every graph must
load, match the I/O its config.json declares, and reproduce golden.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from model.export.golden import GOLDEN_FILE, open_session, run_graph

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
MODELS = sorted(p.parent.name for p in ARTIFACTS.glob("*/config.json"))  # ours and the imported ones
# What git may hold in artifacts/ (README "Checkpoints from elsewhere"): no int8 variants, which the
# Dockerfile's int8 stage builds (model/export/int8.py), and the classifier's packed pretraining run.
BUDGET_MB = 130


def test_the_three_models_and_the_imported_classifier_are_committed() -> None:
    assert {"translator", "generator", "classifier", "classifier-minilm"} <= set(MODELS)


def test_artifacts_stay_within_the_budget() -> None:
    total = sum(p.stat().st_size for p in ARTIFACTS.rglob("*") if p.is_file())
    assert total <= BUDGET_MB * 1_000_000, f"artifacts/ holds {total / 1e6:.1f} MB, over the {BUDGET_MB} MB budget"


@pytest.fixture(params=MODELS)
def folder(request: pytest.FixtureRequest) -> Path:
    name: str = request.param
    return ARTIFACTS / name


def test_folder_is_complete(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["format_version"] == 1 and config["name"] == folder.name
    for graph in config["graphs"].values():
        assert (folder / graph["file"]).is_file()
        if graph["int8_file"]:
            assert (folder / graph["int8_file"]).is_file()
    card = json.loads((folder / "card.json").read_text())
    assert card["metrics"], "the model card records the evaluation"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    for token_id in config["special_tokens"].values():
        assert tokenizer.id_to_token(token_id) is not None


def test_graph_io_matches_config(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    for graph in config["graphs"].values():
        for key in ("file", "int8_file"):
            if not graph[key]:
                continue
            session = open_session(folder, graph[key], config)  # with a weights package's weights filled in
            optional = [i.name for i in session.get_overridable_initializers()]  # inputs with a default
            assert [i.name for i in session.get_inputs()] + optional == [i["name"] for i in graph["inputs"]]
            assert optional == [i["name"] for i in graph["inputs"] if "default" in i]
            assert [o.name for o in session.get_outputs()] == [o["name"] for o in graph["outputs"]]


def test_golden_outputs_reproduce(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    golden = json.loads((folder / GOLDEN_FILE).read_text())
    for role in config["graphs"]:
        names, outputs = run_graph(folder, role)
        for name, out in zip(names, outputs, strict=False):
            if name not in golden[role]:
                continue
            expected = golden[role][name]
            assert list(out.shape) == expected["shape"], name
            np.testing.assert_allclose(out.reshape(-1)[:8], expected["head"], atol=1e-4, rtol=1e-4, err_msg=name)
            assert abs(float(np.abs(out).sum()) - expected["abs_sum"]) <= 1e-4 * max(1.0, expected["abs_sum"]), name
