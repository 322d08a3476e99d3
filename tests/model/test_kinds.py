"""model/kinds.py's records (networks, graph specs, configs, tokenizers, runs) and the recipes cover exactly
the trainable kinds of the registry in contract/, and agree with what the contract requires of their task."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the training extra; .ci/run installs it

from contract.kinds import KINDS
from model.families import FAMILIES
from model.importing.hf_import import detect_family
from model.kinds import MODEL_KINDS, TRAINABLE, model_kind
from scripts import recipes


def test_every_kind_has_a_model_an_export_a_tokenizer_and_a_recipe() -> None:
    assert set(TRAINABLE) == set(KINDS)
    for kind in KINDS:
        record = model_kind(kind)
        assert record.config is not None and record.config.kind == kind
        assert record.task is KINDS[kind].task
        assert record.train_tokenizer is not None and record.stable_run and record.committed_run
        assert callable(getattr(recipes, f"train_{kind}"))
    assert {k.name for k in MODEL_KINDS.values() if not k.trainable} == {"embedder"}  # imported, never trained


def test_each_kind_has_the_special_tokens_its_task_needs() -> None:
    for kind in KINDS.values():
        assert set(kind.task.special_tokens) <= set(model_kind(kind.name).special_tokens or {}), kind.name


def test_the_importer_reads_the_registry_families() -> None:
    for family in FAMILIES:
        assert detect_family({"model_type": family}) == family


def test_every_registry_family_has_a_test_checkpoint() -> None:
    """tests/hf_checkpoints.py builds one random checkpoint of each family the registry lists (the parity tests)."""
    from tests.hf_checkpoints import DECODER_CHECKPOINTS, ENCODER_CHECKPOINTS, SEQ2SEQ_CHECKPOINTS
    from tests.hf_checkpoints import FAMILIES as BUILT

    assert set(FAMILIES) <= set(BUILT) | set(ENCODER_CHECKPOINTS) | set(DECODER_CHECKPOINTS) | set(SEQ2SEQ_CHECKPOINTS)
