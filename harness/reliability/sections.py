"""The reliability sections. Each takes a running server (harness.Target), drives it over loopback HTTP
with bounded loops, and returns an Outcome: its figures, and what failed (an empty list is a pass).

The sections that need to start servers of their own (mismatched artifacts, injected faults) take no
target; chat_templates takes the folder of the suite's own models (harness/reliability/suite_models.py),
which the shared server serves beside the committed artifacts. tests/reliability/test_reliability.py runs
them all in CI; `python -m harness.reliability` runs them and writes the JSON report and the table in
docs/testing.md; harness/deploy/run.sh runs `load` and `sigterm` against the container."""

from harness.reliability.bad_input import bad_input
from harness.reliability.bombs import list_bombs
from harness.reliability.broken_artifacts import artifacts
from harness.reliability.bursts import attention, tokenize
from harness.reliability.contract import schemathesis
from harness.reliability.faults import faults
from harness.reliability.harness import Outcome
from harness.reliability.kv_budget import kv_budget
from harness.reliability.memory import memory
from harness.reliability.sigterm import sigterm
from harness.reliability.templates import chat_templates
from harness.reliability.traffic import disconnects, load, overload, soak
from harness.reliability.transport import slow_clients, stuck_drain, stuck_readers

__all__ = [
    "Outcome",
    "artifacts",
    "attention",
    "bad_input",
    "chat_templates",
    "disconnects",
    "faults",
    "kv_budget",
    "list_bombs",
    "load",
    "memory",
    "overload",
    "schemathesis",
    "sigterm",
    "slow_clients",
    "soak",
    "stuck_drain",
    "stuck_readers",
    "tokenize",
]
