"""Shared fixtures: tiny exported artifacts (built once per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(folder with translator/, generator/, classifier/ tiny artifacts, {kind: PyTorch reference model}).

    Needs the training extra (torch); tests that use it skip only where it is not installed.
    """
    pytest.importorskip("torch")
    from model.export import export_tiny_artifacts

    folder = tmp_path_factory.mktemp("tiny-artifacts")
    models = export_tiny_artifacts(folder)
    return folder, models
