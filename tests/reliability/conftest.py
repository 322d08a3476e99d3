"""Collects each section's Outcome; at the end of the session writes the JSON report and prints the table.

The report goes to $RELIABILITY_REPORT (default .pytest_cache/reliability.json): CI shows the figures in
its log without touching the committed bench_results/reliability.json (`python -m harness.reliability`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.reliability.__main__ import write_report
from harness.reliability.harness import REPO, SUITE_SETTINGS, LocalServer, Target
from harness.reliability.report import table
from harness.reliability.sections import Outcome
from harness.reliability.suite_models import link_models, suite_models

OUTCOMES: list[Outcome] = []


@pytest.fixture(scope="package", params=["1", "2"], ids=["api_processes=1", "api_processes=2"])
def api_processes(request: pytest.FixtureRequest) -> str:
    """Every section runs against the server in one process and with its HTTP front end in two."""
    processes: str = request.param
    return processes


@pytest.fixture(scope="session")
def suite_models_dir(request: pytest.FixtureRequest) -> Path:
    """The suite's chat model and reranker (harness/reliability/suite_models.py), built once per source
    version and kept in pytest's cache beside the tests' imported checkpoints."""
    return suite_models(Path(request.config.cache.mkdir("reliability-models")))


@pytest.fixture(scope="session")
def served_artifacts(suite_models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed artifacts and the suite's own models in one folder (links)."""
    return link_models(tmp_path_factory.mktemp("reliability") / "served", suite_models_dir)


@pytest.fixture(scope="package")
def suite_server(api_processes: str, served_artifacts: Path) -> Iterator[Target]:
    """One server (the committed artifacts, the suite's chat model and reranker, the suite's small limits)
    for the sections that share it."""
    with LocalServer(served_artifacts, SERVE_API_PROCESSES=api_processes) as server:
        yield server.wait_ready()


@pytest.fixture
def record() -> Iterator[list[Outcome]]:
    yield OUTCOMES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not OUTCOMES:
        return
    path = Path(os.environ.get("RELIABILITY_REPORT", REPO / ".pytest_cache" / "reliability.json"))
    report = write_report(OUTCOMES, path, "pytest", SUITE_SETTINGS)
    terminalreporter.write_sep("-", f"reliability figures ({report['seconds']} s; {path})")
    terminalreporter.write_line(table(report))
