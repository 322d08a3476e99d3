"""Attention maps for visualization: collect per-step rows, assemble square matrices, make them JSON."""

from __future__ import annotations

import numpy as np

DECIMALS = 4


def stack_rows(blocks: list[np.ndarray], width: int) -> np.ndarray:
    """Stack query-row blocks [H, q_i, k_i] (k_i <= width) into [H, sum q_i, width], zero-filling the
    keys a row could not see yet (causal decoding)."""
    padded = [np.pad(b, ((0, 0), (0, 0), (0, width - b.shape[2]))) for b in blocks]
    return np.concatenate(padded, axis=1)


def to_json(weights: np.ndarray) -> list:
    """Nested lists rounded to a few decimals: plenty for a heat map, a fraction of the bytes."""
    return np.round(weights.astype(np.float64), DECIMALS).tolist()
