"""Beam search over every beam request of a batch at once, and the n-gram ban every translation row uses.

The rule, the same in `model/network/decoding.py::beam_search` (the PyTorch reference that the model card's
scores come from; `tests/model/test_beam_parity.py` checks both give the same token ids):

- each step scores every continuation of a live hypothesis: its summed logprob plus the token's float32
  log-softmax, with tokens that would repeat an n-gram (`no_repeat_ngram_size`) at -inf;
- a request ranks its 2 * num_beams best candidates (ties: lower flat index, parent row then token);
  an end token ranked within the top num_beams finishes that hypothesis, one ranked lower is dropped;
  the num_beams best other candidates live on (at the first step the request has a single row);
- a finished hypothesis scores logprob / length ** length_penalty, its length counting the end token;
  a request keeps its num_beams best finished ones;
- a request is done when it holds num_beams finished hypotheses and its best live one, scored at its
  current length, does not beat the worst of them (transformers' `early_stopping=False`); when its
  hypotheses reach max_new_tokens (the live ones then join the finished, scored at that length); or when
  no candidate is left (then, if nothing finished, its live hypotheses are the answer as they are);
- it answers with its n_best best finished hypotheses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.engine.tokens.rows import RowArrays


@dataclass(frozen=True)
class Targets(RowArrays):
    """Each row's target tokens after bos and their summed logprob."""

    history: np.ndarray  # [R, capacity] int32, the first `length` entries used
    length: np.ndarray  # [R] int64
    logprob: np.ndarray  # [R] float32

    @classmethod
    def empty(cls, rows: int, capacity: int) -> Targets:
        zeros = np.zeros(rows, dtype=np.int64)
        return cls(np.zeros((rows, capacity), dtype=np.int32), zeros, zeros.astype(np.float32))

    def extended(self, parents: np.ndarray, tokens: np.ndarray, logprob: np.ndarray) -> Targets:
        """The rows after a step: row i continues row parents[i] with tokens[i]; its logprob is logprob[i]."""
        history, length = self.history[parents], self.length[parents] + 1
        history[np.arange(len(parents)), length - 1] = tokens
        return Targets(history, length, logprob.astype(np.float32))

    def tokens(self, row: int) -> list[int]:
        result: list[int] = self.history[row, : self.length[row]].tolist()
        return result


def banned_ngrams(targets: Targets, sizes: np.ndarray, distinct: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """(rows, tokens) whose token would repeat an n-gram of the row (n = sizes[row]; 0 is off;
    `distinct`: the values in sizes)."""
    found_rows, found_tokens = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for n in sorted(distinct - {0}):
        rows = np.flatnonzero((sizes == n) & (targets.length >= n))
        if not len(rows):
            continue
        lengths = targets.length[rows]
        width = int(lengths.max())
        history = targets.history[rows, :width].astype(np.int64)
        starts = width - n + 1  # candidate n-gram starts 0..width-n
        match = np.arange(starts)[None, :] <= (lengths - n)[:, None]
        for j in range(n - 1):  # the n-gram's first n-1 tokens equal the row's last n-1 tokens
            last = history[np.arange(len(rows)), lengths - (n - 1) + j]
            match &= history[:, j : j + starts] == last[:, None]
        r, i = np.nonzero(match)
        found_rows.append(rows[r])
        found_tokens.append(history[r, i + n - 1])
    return np.concatenate(found_rows), np.concatenate(found_tokens)


def banned_ngram_tokens(tokens: list[int], n: int) -> list[int]:
    """The tokens `banned_ngrams` bans after one row's `tokens` (for tests and callers with a list)."""
    if n <= 0 or len(tokens) < n:
        return []
    targets = Targets(np.asarray([tokens], dtype=np.int32), np.asarray([len(tokens)]), np.zeros(1, np.float32))
    result: list[int] = banned_ngrams(targets, np.asarray([n]), {n})[1].tolist()
    return result


@dataclass
class Finished:
    score: float
    logprob: float
    tokens: list[int]  # without the end token
    extra: Any = None  # what the caller keeps with it (its attention rows)


@dataclass
class BeamPool:
    """One request's settings and its best finished hypotheses, best first."""

    num_beams: int
    length_penalty: float
    max_new_tokens: int
    finished: list[Finished] = field(default_factory=list)

    def add(self, logprob: float, tokens: list[int], length: int, extra: Any = None) -> None:
        score = logprob / max(length, 1) ** self.length_penalty
        self.finished.append(Finished(score, logprob, tokens, extra))
        self.finished.sort(key=lambda f: -f.score)
        del self.finished[self.num_beams :]

    @property
    def worst(self) -> float:
        return self.finished[-1].score if len(self.finished) >= self.num_beams else -np.inf


@dataclass(frozen=True)
class Candidates:
    """Each row's best next tokens (service/runtime/scoring_head.py), best first, ties to the lower token:
    enough of them that, after the banned ones (at -inf), 2 * num_beams remain."""

    logprob: np.ndarray  # [R, K] float32 log-softmax values; banned tokens at -inf
    token: np.ndarray  # [R, K] int64


@dataclass(frozen=True)
class BeamStep:
    """The live rows after a step, request by request: row i continues row parents[i] with tokens[i]."""

    parents: np.ndarray  # [R'] int64 (the step's row numbering)
    tokens: np.ndarray  # [R'] int64
    logprob: np.ndarray  # [R'] float32 summed
    counts: np.ndarray  # [n] live rows per request; 0: done


def beam_step(
    candidates: Candidates,
    targets: Targets,
    counts: np.ndarray,
    pools: list[BeamPool],
    eos: int,
    extra: Callable[[int], Any] = lambda row: None,
) -> BeamStep:
    """One step for requests whose rows are consecutive blocks of `counts[i]` rows; finished hypotheses
    go to the pools (`extra(row)` is kept with them). A request ranks its rows' candidates by flat index
    (row, then rank within the row), which orders ties as ranking [rows, vocab] would: row, then token."""
    K = candidates.logprob.shape[1]
    total = candidates.logprob + targets.logprob[:, None]  # [R, K] candidate scores
    offsets = np.cumsum(counts) - counts
    beams = np.asarray([p.num_beams for p in pools], dtype=np.int64)
    lengths = targets.length[offsets]  # the rows of a request have one length
    parts: list[tuple[np.ndarray, ...]] = []
    for c, k in sorted({(int(c), int(k)) for c, k in zip(counts, beams, strict=True)}):
        group = np.flatnonzero((counts == c) & (beams == k))
        rows = offsets[group, None] + np.arange(c)  # [G, c]
        flat = total[rows].reshape(len(group), c * K)
        ranked, values = _top(flat, min(2 * k, c * K))
        parent = np.take_along_axis(rows, ranked // K, axis=1)
        token = np.take_along_axis(candidates.token[rows].reshape(len(group), c * K), ranked, axis=1)
        valid, end = np.isfinite(values), token == eos
        for g, j in zip(*np.nonzero(end & valid & (np.arange(values.shape[1]) < k)), strict=True):
            i, p = int(group[g]), int(parent[g, j])
            pools[i].add(float(values[g, j]), targets.tokens(p), int(lengths[i]) + 1, extra(p))
        live = valid & ~end
        g, j = np.nonzero(live & (np.cumsum(live, axis=1) <= k))
        parts.append((group[g], parent[g, j], token[g, j], values[g, j]))
    request, parents, tokens, values = (np.concatenate(column) for column in zip(*parts, strict=True))
    order = np.argsort(request, kind="stable")  # request by request, best first within each
    request, parents, tokens, values = request[order], parents[order], tokens[order], values[order]
    live_counts = np.bincount(request, minlength=len(pools))
    done = _finish(pools, targets, (offsets, counts), (request, parents, tokens, values), live_counts, extra)
    alive = ~done[request]
    return BeamStep(parents[alive], tokens[alive], values[alive], np.where(done, 0, live_counts))


def _top(candidates: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's `width` best indices, best first (ties: lower index), and their values."""
    order = np.argsort(-candidates, axis=1, kind="stable")[:, :width]
    return order, np.take_along_axis(candidates, order, axis=1)


def _finish(
    pools: list[BeamPool],
    targets: Targets,
    blocks: tuple[np.ndarray, np.ndarray],
    children: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    live_counts: np.ndarray,
    extra: Callable[[int], Any],
) -> np.ndarray:
    """Which requests are done after this step (see the module docstring); fills their pools.
    `blocks`: each request's first row and row count before the step; `children`: the live candidates."""
    (offsets, counts), (request, parents, tokens, values) = blocks, children
    lengths = targets.length[offsets]
    new_length = lengths + 1
    penalty = np.asarray([p.length_penalty for p in pools])
    at_max = new_length >= np.asarray([p.max_new_tokens for p in pools])
    has = live_counts > 0
    best = np.full(len(pools), -np.inf)
    best[has] = values[(np.cumsum(live_counts) - live_counts)[has]]  # each request's best live child
    worst = np.asarray([p.worst for p in pools])
    done: np.ndarray = at_max | (live_counts == 0) | (worst >= best / new_length.astype(np.float64) ** penalty)
    for child in np.flatnonzero(at_max[request]).tolist():  # live hypotheses at the length limit
        i, p = int(request[child]), int(parents[child])
        pools[i].add(float(values[child]), [*targets.tokens(p), int(tokens[child])], int(new_length[i]), extra(p))
    for i in np.flatnonzero((live_counts == 0) & ~at_max).tolist():  # nothing left to try
        if not pools[i].finished:
            for row in range(int(offsets[i]), int(offsets[i] + counts[i])):
                pools[i].add(float(targets.logprob[row]), targets.tokens(row), int(lengths[i]), extra(row))
    return done
