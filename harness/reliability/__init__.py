"""The reliability suite: a real server under load, faults and bad input; `python -m harness.reliability`
or tests/reliability."""
