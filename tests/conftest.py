"""Shared fixtures: tiny exported artifacts, built once per version of model/ and cached.

Set SERVE_TEST_ARTIFACTS=/some/dir to test the service against prebuilt artifacts instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.kinds import KINDS

REPO = Path(__file__).resolve().parents[1]
REAL_ARTIFACTS = REPO / "artifacts"
MODELS = tuple(KINDS)


# The full lane only (`make test-all`, which CI runs; `make test` is `-m "not slow"`): servers and browsers
# driven by real clients, the benchmarks' smoke runs, trainings, and everything that builds a Hugging Face
# checkpoint with `transformers` and imports it (node-id prefixes, relative to the repository).
SLOW = (
    "tests/reliability/",
    "tests/clients/",
    "tests/service/test_bench_",
    "tests/model/test_training.py",
    "tests/model/test_beam_parity.py",
    "tests/model/test_hf_",
    "tests/service/test_api_imported_",
    "tests/service/test_api_llama.py",
    "tests/service/test_api_seq2seq.py",
    "tests/service/test_runtime_contract.py::test_n_kv_heads_must_be_the_graphs",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


def _model_source_hash() -> str:
    """Of everything a tiny export depends on: model/ (model/export/tiny.py included) and contract/ (golden
    records too)."""
    digest = hashlib.sha256()
    sources = [*(REPO / "model").rglob("*.py"), *(REPO / "contract").rglob("*.py")]
    for path in sorted(sources):
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cached_build(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cache_name: str,
    key: str,
    done: list[str],
    build: Callable[[Path], None],
) -> Path:
    """What `build` writes into a folder, kept in pytest's cache as ``<cache_name>/<key>`` (the folders of
    other keys removed) and built again (into a staging folder, then copied) when a file of `done` (paths
    relative to it) is missing."""
    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir(cache_name)) if cache is not None else tmp_path_factory.mktemp(cache_name)
    folder = root / key
    if not all((folder / path).is_file() for path in done):
        staging = tmp_path_factory.mktemp(f"{cache_name}-staging")
        with warnings.catch_warnings():  # the builders' warnings are not about the tests
            warnings.simplefilter("ignore")
            build(staging)
        for stale in root.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        shutil.copytree(staging, folder)
    return folder


def _tiny_export(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cache_name: str,
    names: tuple[str, ...],
    in_place_cache: bool = False,
) -> Path:
    """Tiny artifacts `names` (model/export/tiny.py), exported once per source version."""

    def export(staging: Path) -> None:
        from model.export.tiny import export_tiny_artifacts

        export_tiny_artifacts(staging, names, in_place_cache=in_place_cache)

    done = [f"{name}/golden.json" for name in names]
    return _cached_build(request, tmp_path_factory, cache_name, _model_source_hash(), done, export)


@pytest.fixture(scope="session")
def tiny_artifacts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny randomly initialized artifacts (model/export/tiny.py), exported once per source version.

    Exporting needs the training extra (torch); .ci/run installs it.
    """
    if override := os.environ.get("SERVE_TEST_ARTIFACTS"):
        return Path(override)
    return _tiny_export(request, tmp_path_factory, "tiny-artifacts", MODELS)


@pytest.fixture(scope="session")
def tiny_in_place_artifacts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny generator alone, its graph writing its cache in place (as an imported decoder's does)."""
    return _tiny_export(request, tmp_path_factory, "tiny-in-place", ("generator",), in_place_cache=True)


@pytest.fixture(scope="session")
def tiny_encoder_artifacts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny encoder artifacts beside the kinds (model/export/tiny.py TINY_ENCODERS): ``<folder>/embedder``
    (embedding task, mean pooling, normalize true) and ``<folder>/reranker`` (classification, one label
    "score"); exported once per source version, in a folder of their own so that ``tiny_artifacts`` serves
    what it always did."""
    from model.export.tiny import TINY_ENCODERS

    return _tiny_export(request, tmp_path_factory, "tiny-encoders", TINY_ENCODERS)


@pytest.fixture(scope="session")
def tiny_artifacts_with_encoders(tiny_artifacts: Path, tiny_encoder_artifacts: Path,
                                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder serving every tiny artifact: the kinds of ``tiny_artifacts`` plus embedder and reranker."""
    folder = tmp_path_factory.mktemp("tiny-all")
    for source in (tiny_artifacts, tiny_encoder_artifacts):
        for artifact in source.iterdir():
            if (artifact / "config.json").is_file():
                shutil.copytree(artifact, folder / artifact.name)
    return folder


@pytest.fixture(scope="session")
def hf_imports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small random transformers checkpoints (tests/hf_checkpoints.py) in ``checkpoints/<family>`` and
    their imports by scripts/import_checkpoint in ``artifacts/<family>``; built once per source version."""
    from tests.hf_checkpoints import FAMILIES, build_checkpoint

    return _imported_checkpoints(request, tmp_path_factory, "hf-imports", list(FAMILIES), build_checkpoint)


@pytest.fixture(scope="session")
def hf_encoder_imports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small random encoder checkpoints of every import rule (tests/hf_checkpoints.py ENCODER_CHECKPOINTS:
    RoBERTa, XLM-RoBERTa, DistilBERT, a cross-encoder, a sentence-transformers folder, a headless RoBERTa) in
    ``checkpoints/<name>`` and their imports in ``artifacts/<name>``; built once per source version."""
    from tests.hf_checkpoints import ENCODER_CHECKPOINTS, build_encoder_checkpoint

    names = list(ENCODER_CHECKPOINTS)
    return _imported_checkpoints(request, tmp_path_factory, "hf-encoder-imports", names, build_encoder_checkpoint)


@pytest.fixture(scope="session")
def hf_decoder_imports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small random Llama, Qwen2 and Mistral checkpoints (tests/hf_checkpoints.py DECODER_CHECKPOINTS: grouped-query
    attention, each rope scaling type, tied and separate heads) in ``checkpoints/<name>`` and their imports in
    ``artifacts/<name>``; built once per source version."""
    from tests.hf_checkpoints import DECODER_CHECKPOINTS, build_decoder

    return _imported_checkpoints(request, tmp_path_factory, "hf-decoder-imports", list(DECODER_CHECKPOINTS),
                                 build_decoder)


@pytest.fixture(scope="session")
def hf_seq2seq_imports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small random sequence-to-sequence checkpoints beyond Marian and BART (tests/hf_checkpoints.py
    SEQ2SEQ_CHECKPOINTS: M2M100 with language codes) in ``checkpoints/<name>`` and their imports in
    ``artifacts/<name>``; built once per source version."""
    from tests.hf_checkpoints import SEQ2SEQ_CHECKPOINTS, build_seq2seq

    return _imported_checkpoints(request, tmp_path_factory, "hf-seq2seq-imports", list(SEQ2SEQ_CHECKPOINTS),
                                 build_seq2seq)


@pytest.fixture(scope="session")
def chat_import(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 checkpoint with a ChatML template in its tokenizer_config.json (tests/chat_checkpoint.py) in
    ``checkpoints/chat`` and its import in ``artifacts/chat``; built once per source version."""
    from tests.chat_checkpoint import NAME, build_chat_checkpoint

    sources = (REPO / "tests" / "chat_checkpoint.py", REPO / "tests" / "chat_templates.py")
    return _imported_checkpoints(request, tmp_path_factory, "hf-chat-import", [NAME], build_chat_checkpoint, sources)


@pytest.fixture(scope="session")
def chat_artifacts(chat_import: Path, tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder serving the tiny chat import (``chat``, with a template) and the tiny ``generator`` (without)."""
    folder = tmp_path_factory.mktemp("chat-artifacts")
    shutil.copytree(chat_import / "artifacts" / "chat", folder / "chat")
    shutil.copytree(tiny_artifacts / "generator", folder / "generator")
    return folder


def _imported_checkpoints(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cache_name: str,
    names: list[str],
    build: Callable[[str, Path], Path],
    sources: tuple[Path, ...] = (),
) -> Path:
    """``checkpoints/<name>`` built by `build` and ``artifacts/<name>`` imported from it, cached in pytest's
    cache under a digest of the model code, transformers' version, tests/hf_checkpoints.py and `sources`."""
    import transformers

    digest = hashlib.sha256((_model_source_hash() + transformers.__version__).encode())
    for source in (REPO / "tests" / "hf_checkpoints.py", *sources):
        digest.update(source.read_bytes())

    def build_and_import(staging: Path) -> None:
        from model.importing.hf_artifact import import_to_artifact

        for name in names:
            checkpoint = build(name, staging / "checkpoints" / name)
            import_to_artifact(checkpoint, staging / "artifacts" / name, name, int8=False)

    done = [f"artifacts/{name}/golden.json" for name in names]
    return _cached_build(request, tmp_path_factory, cache_name, digest.hexdigest()[:16], done, build_and_import)
