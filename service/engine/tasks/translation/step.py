"""One translator decoder step as the batch's two kinds of rows read it (decoding.py): the
last position's logits for num_beams=1 rows, and each beam row's best candidates, either from the decoder
graph's own scoring head (its ``top_logprobs``/``top_ids`` outputs: [rows, k] instead of [rows, vocab]
logits copied out of ONNX Runtime and scored by a second session) or from the standalone head
(service/runtime/scoring_head.py) on the logits, for graphs exported without it. Both are the same ONNX
nodes on the same logits, so the candidates are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.engine.sequence import Emit
from service.runtime.scoring_head import TopLogprobs


def beam_width(num_beams: int, ban_rows: np.ndarray, vocab_size: int) -> int:
    """Candidates per beam row: 2 * num_beams (the widest request's) plus the most tokens the n-gram ban
    removes from one row (``ban_rows``: a row index per banned pair), so that ranking them ranks the whole
    vocabulary; never more than the vocabulary."""
    most_banned = int(np.bincount(ban_rows).max()) if len(ban_rows) else 0
    return min(2 * num_beams + most_banned, vocab_size)


def forced_logits(logits: np.ndarray, forced: list[tuple[int, int]]) -> np.ndarray:
    """``logits`` where each forced (row, token) can choose only its token, with logprob 0."""
    if not forced:
        return logits
    logits = logits.copy()
    for row, token in forced:
        logits[row] = -np.inf
        logits[row, token] = 0.0
    return logits


@dataclass(frozen=True)
class StepOutput:
    """One decoder step: what the greedy or sampled rows and the beam rows read."""

    logits: np.ndarray | None  # [rows, vocab], forced first tokens applied; None when no row needs them
    top: tuple[np.ndarray, np.ndarray] | None  # the graph's head: ([rows, k] logprobs, [rows, k] ids), or None
    k: int  # candidates per beam row (0 without beam rows)
    banned: tuple[np.ndarray, np.ndarray]  # (row, token) pairs the n-gram ban forbids
    offsets: np.ndarray  # each request's first row
    emits: list[Emit]  # what the step releases, appended by both

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        assert self.logits is not None
        return self.logits if len(rows) == len(self.logits) else self.logits[rows]

    def candidates(self, rows: np.ndarray, head: TopLogprobs) -> tuple[np.ndarray, np.ndarray]:
        """The k best (logprob, token) of each of ``rows``, best first, ties to the lower token id (arrays
        the caller may change): the graph's head where it ran, else the standalone head on the logits."""
        if self.top is None:
            return head(self.of_rows(rows), self.k)
        logprob, token = (a[rows] for a in self.top)  # fancy indexing: copies
        return logprob, token
