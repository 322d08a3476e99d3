"""What the one-step encoder models (classifier, embedder) share: right-padded feeds for a batch of token
id rows, and the split of a scheduled batch into runs of similar length.

The scheduler admits requests first come, first served under a padded-token budget; one long text among
31 short ones would make every short one pay for its padding. `length_groups` sorts the rows by length and
cuts them into runs that minimise the padded tokens plus a fixed cost per run (TEI's batching pads each
batch to its longest text too, and sorts by length for the same reason)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from contract.names import ATTENTION_MASK, INPUT_IDS, TOKEN_TYPE_IDS

R = TypeVar("R")


class Company:
    """Whether an encoder's run shares the machine with other requests' work: it answers several requests,
    or the run before it did (a run of one under load). Such runs take the busy session (fewer threads,
    service/runtime/sessions.py); a lone request among lone requests gets every thread."""

    def __init__(self) -> None:
        self.recent = False

    def busy(self, handles: Sequence[object]) -> bool:
        several = len({id(h) for h in handles}) > 1
        busy, self.recent = several or self.recent, several
        return busy


# One more ORT run costs about as much as this many padded tokens of a small encoder on CPU (the run's fixed
# overhead, ~0.2 ms, against ~5 us per token of all-MiniLM-L6-v2 on one core): a run of its own pays off
# only for rows that would otherwise carry more padding than this.
RUN_COST_TOKENS = 48


def encoder_feeds(
    rows: Sequence[Sequence[int]], type_rows: Sequence[Sequence[int]] | None, pad: int
) -> dict[str, np.ndarray]:
    """input_ids, attention_mask and (where the graph has them, `type_rows` given) token_type_ids, right-padded."""
    B, S = len(rows), max(len(r) for r in rows)
    ids = np.full((B, S), pad, dtype=np.int64)
    mask = np.zeros((B, S), dtype=np.int64)
    for b, row in enumerate(rows):
        ids[b, : len(row)], mask[b, : len(row)] = row, 1
    feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask}
    if type_rows is not None:
        types = np.zeros((B, S), dtype=np.int64)
        for b, row in enumerate(type_rows):
            types[b, : len(row)] = row
        feeds[TOKEN_TYPE_IDS] = types
    return feeds


def length_groups(lengths: Sequence[int], run_cost: int = RUN_COST_TOKENS) -> list[list[int]]:
    """Indices of `lengths` in runs of ascending length that minimise sum(rows x longest) + run_cost per run
    (an exact split: dynamic programming over the sorted lengths, O(n^2) for n <= the batch size)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0] * (n + 1)  # best[j]: the cost of the first j sorted rows
    cut = [0] * (n + 1)  # cut[j]: where the last run of the best split of the first j rows starts
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + (j - i) * longest + run_cost, i) for i in range(j))
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def run_in_groups(lengths: Sequence[int], run: Callable[[list[int]], list[R]]) -> list[R]:
    """`run(indices)` for each length group; the results back in the original order."""
    results: dict[int, R] = {}
    for group in length_groups(lengths):
        results.update(zip(group, run(group), strict=True))
    return [results[i] for i in range(len(lengths))]
