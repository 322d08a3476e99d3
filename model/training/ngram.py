"""Interpolated Kneser-Ney n-gram language model over token ids (numpy, vectorised).

The perplexity baseline for the generator, on the same token stream. n-grams
are packed into int64 keys (``sum t_j * V**(k-j)``) and looked up with
``np.searchsorted``, so fitting 2.5M tokens takes seconds. The highest order
uses raw counts, lower orders continuation counts (how many distinct tokens
precede the n-gram), each with one discount ``D = n1 / (n1 + 2 n2)`` (kept in [0.1, 1]); the
unigram level is interpolated with a uniform distribution over the vocabulary,
so every id gets a non-zero probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class _Level:
    """Counts of one order: sorted n-gram keys and, per context, total count and type count."""

    keys: np.ndarray
    counts: np.ndarray
    context_keys: np.ndarray
    context_totals: np.ndarray
    context_types: np.ndarray
    discount: float


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at the positions of ``queries`` in ``sorted_keys``; 0 where absent."""
    if len(sorted_keys) == 0:
        return np.zeros(len(queries), dtype=values.dtype)
    pos = np.minimum(np.searchsorted(sorted_keys, queries), len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == queries, values[pos], 0)


class KneserNeyLM:
    """Interpolated Kneser-Ney LM; trigram by default."""

    def __init__(self, vocab_size: int, order: int = 3) -> None:
        if order < 1 or vocab_size ** order >= 2**63:
            raise ValueError(f"order {order} with vocab {vocab_size} does not fit int64 keys")
        self.vocab_size, self.order = vocab_size, order
        self.levels: list[_Level] = []

    def _keys(self, grams: np.ndarray) -> np.ndarray:
        """Pack the rows of an int64 [N, k] array into one key per row."""
        keys = np.zeros(len(grams), dtype=np.int64)
        for column in grams.T:
            keys = keys * self.vocab_size + column
        return keys

    def _windows(self, ids: np.ndarray, k: int) -> np.ndarray:
        """All length-k windows of a 1-D array, as [N-k+1, k]."""
        return np.lib.stride_tricks.sliding_window_view(ids, k)

    def fit(self, token_ids: Sequence[int] | np.ndarray) -> KneserNeyLM:
        """Count n-grams of a token stream (documents joined by their separator token)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        if len(ids) < self.order or ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError("need at least `order` tokens, all in [0, vocab_size)")
        keys, counts = np.unique(self._keys(self._windows(ids, self.order)), return_counts=True)
        levels = []
        for k in range(self.order, 0, -1):
            levels.append(self._level(keys, counts))
            # continuation counts of the (k-1)-grams: distinct tokens seen before each
            keys, counts = np.unique(keys % self.vocab_size ** (k - 1), return_counts=True)
        self.levels = levels[::-1]  # levels[k - 1] holds order k
        return self

    def _level(self, keys: np.ndarray, counts: np.ndarray) -> _Level:
        """Context totals/types and the discount for one order's counts."""
        context_keys, inverse = np.unique(keys // self.vocab_size, return_inverse=True)
        n1, n2 = np.sum(counts == 1), np.sum(counts == 2)
        discount = float(np.clip(n1 / (n1 + 2 * n2), 0.1, 1.0)) if n1 + n2 else 0.75  # > 0: no zero probs
        return _Level(keys, counts, context_keys, np.bincount(inverse, weights=counts).astype(np.int64),
                      np.bincount(inverse).astype(np.int64), discount)

    def _prob(self, grams: np.ndarray) -> np.ndarray:
        """P(last column | earlier columns) per row of an [N, order] array; -1 marks no token."""
        uniform = np.full(len(grams), 1.0 / self.vocab_size)
        prob = uniform
        for k, level in enumerate(self.levels, start=1):
            window = grams[:, self.order - k:]
            usable = (window >= 0).all(axis=1)
            keys = self._keys(np.where(window >= 0, window, 0))
            total = _lookup(level.context_keys, level.context_totals, keys // self.vocab_size)
            types = _lookup(level.context_keys, level.context_types, keys // self.vocab_size)
            count = _lookup(level.keys, level.counts, keys)
            seen = usable & (total > 0)
            safe_total = np.maximum(total, 1)
            mixed = (np.maximum(count - level.discount, 0) + level.discount * types * prob) / safe_total
            prob = np.where(seen, mixed, prob)
        return prob

    def log_probs(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Natural-log probability of every token after the first, given up to order-1 previous ones."""
        ids = np.asarray(token_ids, dtype=np.int64)
        padded = np.concatenate([np.full(self.order - 1, -1, dtype=np.int64), ids])
        log_probs: np.ndarray = np.log(self._prob(self._windows(padded, self.order)[1:]))
        return log_probs

    def perplexity(self, token_ids: Sequence[int] | np.ndarray) -> float:
        """exp(mean negative log-likelihood) over all tokens but the first."""
        return float(np.exp(-self.log_probs(token_ids).mean()))

    def next_token_probs(self, context: Sequence[int]) -> np.ndarray:
        """The full distribution over the vocabulary after ``context`` (sums to 1)."""
        history = ([-1] * self.order + list(context))[len(context) + 1:]  # last order-1, -1 padded
        grams = np.column_stack([np.tile(np.asarray(history, dtype=np.int64), (self.vocab_size, 1)),
                                 np.arange(self.vocab_size)])
        return self._prob(grams)
