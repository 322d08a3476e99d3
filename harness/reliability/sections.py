"""The reliability sections. Each takes a running server (harness.Target), drives it over loopback HTTP
with bounded loops, and returns an Outcome: its figures, and what failed (an empty list is a pass).

The sections that need to start servers of their own (mismatched artifacts, injected faults) take no
target. tests/reliability/test_reliability.py runs them all in CI; `python -m harness.reliability`
runs them and writes the JSON report and the table in docs/testing.md; harness/deploy/run.sh runs `load` and
`sigterm` against the container."""

from harness.reliability.contract import bad_input, schemathesis
from harness.reliability.faults import artifacts, faults, sigterm
from harness.reliability.harness import Outcome
from harness.reliability.traffic import attention, disconnects, load, overload, soak, tokenize
from harness.reliability.transport import slow_clients, stuck_drain, stuck_readers

__all__ = [
    "Outcome",
    "artifacts",
    "attention",
    "bad_input",
    "disconnects",
    "faults",
    "load",
    "overload",
    "schemathesis",
    "sigterm",
    "slow_clients",
    "soak",
    "stuck_drain",
    "stuck_readers",
    "tokenize",
]
