"""The reliability suite (issues 12 and 45) in CI: loopback only, bounded loops, a few minutes on 2 cores.
Each test runs one section of harness/reliability/sections.py and fails on any of its failures. The shared
server serves the suite's chat model and reranker too (built at test time: conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.reliability import sections
from harness.reliability.harness import OVERLOAD_SETTINGS, SUITE_SETTINGS, LocalServer, Target
from harness.reliability.memory import MEMORY_SETTINGS
from harness.reliability.sections import Outcome
from harness.reliability.transport import SEND_TIMEOUT_SETTINGS, TRANSPORT_SETTINGS

SOAK_S = float(os.environ.get("RELIABILITY_SOAK_S", "30"))  # shorter, one allocator bump reads as a trend


def passed(outcome: Outcome, record: list[Outcome], api_processes: str = "1") -> bool:
    if api_processes != "1":  # the report keys sections by name: both runs of a section are kept
        outcome.name = f"{outcome.name} (SERVE_API_PROCESSES={api_processes})"
    record.append(outcome)
    return outcome.passed


# The sections that share the suite's server, in the order they run: (test id, section, its arguments).
ON_THE_SUITE_SERVER: list[tuple[str, str, dict[str, Any]]] = [
    ("schemathesis", "schemathesis", {"max_examples": 8}),
    ("bad_input", "bad_input", {}),
    ("load_equals_solo", "load", {"requests": 256, "concurrency": 64}),
    ("attention_amplification", "attention", {}),
    ("tokenize_bursts", "tokenize", {}),
    ("list_bombs", "list_bombs", {}),
    ("disconnects", "disconnects", {}),
    ("soak", "soak", {"seconds": SOAK_S}),
]


@pytest.mark.parametrize(
    ("section", "arguments"), [case[1:] for case in ON_THE_SUITE_SERVER], ids=[case[0] for case in ON_THE_SUITE_SERVER]
)
async def test_on_the_suite_server(
    section: str, arguments: dict[str, Any], suite_server: Target, api_processes: str, record: list[Outcome]
) -> None:
    outcome = await getattr(sections, section)(suite_server, **arguments)
    assert passed(outcome, record, api_processes), outcome.failures


async def test_memory_after_bursts(served_artifacts: Path, record: list[Outcome]) -> None:
    """In one process (the bursts' cost is the generations, not the front end)."""
    with LocalServer(served_artifacts, base=SUITE_SETTINGS | MEMORY_SETTINGS) as server:
        outcome = await sections.memory(server.wait_ready())
    assert passed(outcome, record), outcome.failures


async def test_kv_cache_budget(served_artifacts: Path, record: list[Outcome]) -> None:
    outcome = await sections.kv_budget(served_artifacts)
    assert passed(outcome, record), outcome.failures


async def test_malicious_chat_templates(suite_models_dir: Path, record: list[Outcome]) -> None:
    outcome = await sections.chat_templates(suite_models_dir)
    assert passed(outcome, record), outcome.failures


async def test_overload(api_processes: str, record: list[Outcome]) -> None:
    with LocalServer(base=SUITE_SETTINGS | OVERLOAD_SETTINGS, SERVE_API_PROCESSES=api_processes) as server:
        outcome = await sections.overload(server.wait_ready(), seconds=5)
    assert passed(outcome, record, api_processes), outcome.failures


async def test_sigterm(api_processes: str, record: list[Outcome]) -> None:
    with LocalServer(SERVE_MAX_BATCH_SIZE="16", SERVE_DRAIN_TIMEOUT_S="2", SERVE_API_PROCESSES=api_processes) as server:
        outcome = await sections.sigterm(server.wait_ready())
    assert passed(outcome, record, api_processes), outcome.failures


async def test_artifacts(record: list[Outcome]) -> None:
    outcome = await sections.artifacts()
    assert passed(outcome, record), outcome.failures


async def test_faults(record: list[Outcome]) -> None:
    outcome = await sections.faults()
    assert passed(outcome, record), outcome.failures


async def test_slow_clients_then_stuck_drain(api_processes: str, record: list[Outcome]) -> None:
    with LocalServer(base=SUITE_SETTINGS | TRANSPORT_SETTINGS, SERVE_API_PROCESSES=api_processes) as server:
        target = server.wait_ready()
        slow = await sections.slow_clients(target)
        stuck = await sections.stuck_drain(target)
    assert passed(slow, record, api_processes) & passed(stuck, record, api_processes), slow.failures + stuck.failures


async def test_stuck_readers(api_processes: str, record: list[Outcome]) -> None:
    with LocalServer(base=SUITE_SETTINGS | SEND_TIMEOUT_SETTINGS, SERVE_API_PROCESSES=api_processes) as server:
        outcome = await sections.stuck_readers(server.wait_ready())
    assert passed(outcome, record, api_processes), outcome.failures
