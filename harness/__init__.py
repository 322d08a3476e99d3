"""Programs the tests drive: the reliability suite (harness/reliability) and the container end to end
(harness/deploy)."""
