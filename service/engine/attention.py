"""Attention maps for visualization: collect per-step rows, assemble square matrices, make them JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pydantic_core

from service.engine import budget
from service.engine.errors import InvalidInput

DECIMALS = 4
SCALE = 10**DECIMALS
# The JSON text of every weight rounded to DECIMALS in [0, 1]: repr(k / SCALE), what json gives the rounded float.
_TEXT = np.array([repr(k / SCALE) for k in range(SCALE + 1)], dtype=object)
# Maps grow as layers x heads x tokens^2 (and JSON makes them ~10x bigger): refuse longer sequences.
MAX_TOKENS = 256


def check_length(tokens: int, field: str = "return_attention") -> None:
    if tokens > MAX_TOKENS:
        raise InvalidInput(f"attention maps are limited to {MAX_TOKENS} tokens; this request needs {tokens}", field)


def check_budget(values: int, limit: int) -> None:
    """Refuse a request whose attention maps would hold more than `limit` numbers (SERVE_MAX_ATTENTION_VALUES):
    they grow as items x layers x heads x tokens^2, so a small request could otherwise ask for gigabytes.
    Then reserve them from the server-wide budget (SERVE_MAX_ATTENTION_VALUES_IN_FLIGHT), before any work:
    many requests at the limit at once are refused (429) rather than held all together."""
    if values > limit:
        raise InvalidInput(
            f"the attention maps would hold {values:,} numbers; the limit is {limit:,} "
            "(SERVE_MAX_ATTENTION_VALUES): ask for fewer or shorter texts",
            "return_attention",
        )
    budget.reserve(values, "return_attention")


def stack_rows(blocks: list[np.ndarray], width: int) -> np.ndarray:
    """Stack query-row blocks [H, q_i, k_i] (k_i <= width) into [H, sum q_i, width], zero-filling the
    keys a row could not see yet (causal decoding)."""
    padded = [np.pad(b, ((0, 0), (0, 0), (0, width - b.shape[2]))) for b in blocks]
    return np.concatenate(padded, axis=1)


class AttentionMap:
    """One map as JSON text: nested arrays of the weights rounded to DECIMALS (plenty for a heat map, a
    fraction of the bytes). The API's serializers put the text in place as it is (service/api/responses.py);
    anything else refuses to serialize it (no __dict__), rather than write a wrong shape."""

    __slots__ = ("json",)

    def __init__(self, json: str) -> None:
        self.json = json


def to_json(weights: np.ndarray) -> AttentionMap:
    """The text json.dumps(np.round(weights, DECIMALS).tolist()) would give, without a Python float per
    number (1M numbers made 32 MB of floats and lists, and fragmented the heap) and with the GIL let go
    between rows: each weight's text comes from a table."""
    rounded = np.rint(weights.astype(np.float64) * SCALE)  # np.round's own arithmetic, so the same values
    if rounded.size and not (rounded.min() >= 0 and rounded.max() <= SCALE):  # NaN or not weights: no table
        slow = pydantic_core.to_json(np.round(weights.astype(np.float64), DECIMALS).tolist(), inf_nan_mode="null")
        return AttentionMap(slow.decode())
    return AttentionMap(_nested(rounded.astype(np.intp)))


def _nested(k: np.ndarray) -> str:
    if k.ndim == 1:
        return "[" + ",".join(_TEXT[k].tolist()) + "]"
    return "[" + ",".join([_nested(part) for part in k]) + "]"


@dataclass
class RowAttention:
    """One decoder row's attention so far, per layer one [H, 1, k] self and one [H, 1, Ssrc] cross
    block per step; a beam's child copies its parent's."""

    self_attn: list[list[np.ndarray]]
    cross_attn: list[list[np.ndarray]]

    @classmethod
    def empty(cls, n_layers: int) -> RowAttention:
        return cls([[] for _ in range(n_layers)], [[] for _ in range(n_layers)])

    def copy(self) -> RowAttention:
        return RowAttention([list(r) for r in self.self_attn], [list(r) for r in self.cross_attn])

    def record(self, self_blocks: list[np.ndarray], cross_blocks: list[np.ndarray]) -> None:
        for rows, block in zip(self.self_attn + self.cross_attn, self_blocks + cross_blocks, strict=True):
            rows.append(block)

    def maps(self, steps: int, heads: int, src: int) -> dict[str, list[Any]]:
        """JSON maps of the first `steps` rows (the output tokens; an end token's row is left out)."""
        if steps == 0:
            return {
                "decoder": [to_json(np.zeros((heads, 0, 0)))] * len(self.self_attn),
                "cross": [to_json(np.zeros((heads, 0, src)))] * len(self.cross_attn),
            }
        return {
            "decoder": [to_json(stack_rows(rows[:steps], steps)) for rows in self.self_attn],
            "cross": [to_json(np.concatenate(rows[:steps], axis=1)) for rows in self.cross_attn],
        }
