"""model/'s per-kind tables (torch classes, graph specs, tokenizers, recipes) cover exactly the kinds of
the registry in contract/, and agree with what the contract requires of their task."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the training extra; .ci/run installs it

from model import tokenization
from scripts import recipes
from model.config import CONFIG_CLASSES
from model.export import MODEL_CLASSES, SPECS
from model.hf_import import detect_family
from contract.kinds import FAMILIES, KINDS


def test_every_kind_has_a_model_an_export_a_tokenizer_and_a_recipe() -> None:
    for table in (MODEL_CLASSES, SPECS, CONFIG_CLASSES, tokenization.TRAINERS, tokenization.SPECIAL_TOKENS):
        assert set(table) == set(KINDS)
    for kind in KINDS:
        assert CONFIG_CLASSES[kind].kind == kind
        assert callable(getattr(recipes, f"train_{kind}"))


def test_each_kind_has_the_special_tokens_its_task_needs() -> None:
    for kind in KINDS.values():
        assert set(kind.task.special_tokens) <= set(tokenization.SPECIAL_TOKENS[kind.name]), kind.name


def test_the_importer_reads_the_registry_families() -> None:
    for family, kind in FAMILIES.items():
        assert detect_family({"model_type": family}) == family and kind in KINDS


def test_every_registry_family_has_a_test_checkpoint() -> None:
    """tests/hf_checkpoints.py builds one random checkpoint of each family the registry lists (the parity tests)."""
    from tests.hf_checkpoints import DECODER_CHECKPOINTS, ENCODER_CHECKPOINTS, SEQ2SEQ_CHECKPOINTS
    from tests.hf_checkpoints import FAMILIES as BUILT

    assert set(FAMILIES) <= set(BUILT) | set(ENCODER_CHECKPOINTS) | set(DECODER_CHECKPOINTS) | set(SEQ2SEQ_CHECKPOINTS)
