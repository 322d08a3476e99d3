"""A real server (`python -m service` on the committed artifacts, on a free local port) for the tests that
drive it with the clients people use: the OpenAI SDK, huggingface_hub's InferenceClient, lm-evaluation-
harness and a headless Chromium."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from harness.reliability.harness import LocalServer
from tests.conftest import REAL_ARTIFACTS


@dataclass
class Server:
    url: str
    output: Callable[[], str]  # what the server process has printed so far

    def log_lines(self) -> list[str]:
        return self.output().splitlines()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The committed artifacts with the server's own defaults (one ORT thread each, JSON logs)."""
    settings = {"SERVE_INTRA_OP_THREADS": "1", "SERVE_INTER_OP_THREADS": "1", "SERVE_LOG_FORMAT": "json"}
    with LocalServer(REAL_ARTIFACTS, base=settings) as local:
        local.wait_ready(timeout=180)
        yield Server(local.url, local.output)


@pytest.fixture(scope="session")
def encoder_server(tiny_artifacts_with_encoders) -> Iterator[Server]:
    """The tiny embedder, reranker (a one-label cross-encoder) and classifier (model/export/tiny.py) with the
    server's own defaults: the committed artifacts hold no embedder or reranker to drive the clients with."""
    settings = {"SERVE_INTRA_OP_THREADS": "1", "SERVE_INTER_OP_THREADS": "1", "SERVE_LOG_FORMAT": "json",
                "SERVE_MODELS": "embedder,reranker,classifier"}  # fmt: skip
    with LocalServer(tiny_artifacts_with_encoders, base=settings) as local:
        local.wait_ready(timeout=180)
        yield Server(local.url, local.output)


@pytest.fixture(scope="session")
def chat_server(chat_artifacts) -> Iterator[Server]:
    """The tiny chat import (a ChatML template, tests/chat_checkpoint.py) and the tiny generator (no template)
    with the server's own defaults: the committed generator has no chat template."""
    settings = {"SERVE_INTRA_OP_THREADS": "1", "SERVE_INTER_OP_THREADS": "1", "SERVE_LOG_FORMAT": "json",
                "SERVE_MODELS": "chat,generator"}  # fmt: skip
    with LocalServer(chat_artifacts, base=settings) as local:
        local.wait_ready(timeout=180)
        yield Server(local.url, local.output)
