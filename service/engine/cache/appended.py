"""Per-row decoder state for batched KV-cache decoding: the self-attention cache (left padded) and,
for the translator, the encoder's cross-attention K/V (right padded).

Left padding keeps every row's newest token in the last column, so one step feeds one token per row.
Position ids come from the mask (`cumsum(mask) - 1`), so padding never shifts a row's positions: a row
computes the same thing alone or next to longer rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.names import ATTENTION_MASK, CROSS, ENCODER_ATTENTION_MASK, PAST, POSITION_IDS, PRESENT
from contract.names import kv_names as kv_names  # re-exported: the engine's modules import it from here
from service.runtime.sessions import Tensor, to_numpy


def _stack_padded(
    masks: list[np.ndarray], tensors: list[list[Tensor]], left: bool
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The rows of several states as one: each padded to the longest on the left (the self-attention
    cache) or on the right (the encoder's source), then stacked on the batch axis. Each part is copied
    once, into its place in a zeroed result (pad-then-concatenate copied the running cache twice, on
    every join)."""
    length = max(m.shape[1] for m in masks)
    starts = np.cumsum([0] + [m.shape[0] for m in masks])

    def placed(parts: list[np.ndarray], axis: int) -> np.ndarray:
        first = parts[0]
        shape = list(first.shape)
        shape[0], shape[axis] = int(starts[-1]), length
        out = np.zeros(shape, dtype=first.dtype)
        for part, begin, end in zip(parts, starts[:-1], starts[1:], strict=True):
            n = part.shape[axis]
            span = slice(length - n, length) if left else slice(0, n)
            out[(slice(begin, end), *([slice(None)] * (axis - 1)), span)] = part
        return out

    mask = placed(masks, 1)
    stacked = [placed([to_numpy(t[i]) for t in tensors], 2) for i in range(len(tensors[0]))]
    return mask, stacked


def _is_identity(rows: np.ndarray, n: int) -> bool:
    return len(rows) == n and bool(np.all(rows == np.arange(n)))


@dataclass(frozen=True)
class KVCache:
    mask: np.ndarray  # [B, P] int64, 1 for real past tokens, left padded
    past: list[Tensor]  # 2L tensors [B, Hkv, P, Dh]: key, value per layer (Hkv: the artifact's n_kv_heads)

    @classmethod
    def empty(cls, batch: int, n_layers: int, n_kv_heads: int, d_head: int) -> KVCache:
        zeros = np.zeros((batch, n_kv_heads, 0, d_head), dtype=np.float32)
        return cls(np.zeros((batch, 0), dtype=np.int64), [zeros] * (2 * n_layers))

    @property
    def batch(self) -> int:
        return int(self.mask.shape[0])

    def feeds(self, new_mask: np.ndarray) -> dict[str, Tensor]:
        """Inputs for a step that appends `new_mask.shape[1]` tokens (mask 0 marks left padding)."""
        mask = np.concatenate([self.mask, new_mask], axis=1)  # [B, P+S]
        positions = np.maximum(np.cumsum(mask, axis=1)[:, -new_mask.shape[1] :] - 1, 0)  # [B, S]
        feeds: dict[str, Tensor] = {ATTENTION_MASK: mask, POSITION_IDS: positions}
        feeds.update(zip(kv_names(PAST, len(self.past) // 2), self.past, strict=True))
        return feeds

    def advance(self, outputs: dict[str, Tensor], new_mask: np.ndarray) -> KVCache:
        """The cache after a step: the graph's `present.*` outputs become the past."""
        present = [outputs[name] for name in kv_names(PRESENT, len(self.past) // 2)]
        return KVCache(np.concatenate([self.mask, new_mask], axis=1), present)

    def take(self, rows: np.ndarray) -> KVCache:
        """Keep (or repeat, for beams) the given rows; drop left columns that are padding in every row."""
        if _is_identity(rows, self.batch):
            return self
        mask = self.mask[rows]
        start = int(np.argmax(mask.any(axis=0))) if mask.any() else mask.shape[1]
        return KVCache(mask[:, start:], [to_numpy(t)[rows, :, start:] for t in self.past])

    def reorder(self, rows: np.ndarray) -> KVCache:
        """Row i continues row rows[i] (beams). With the row count unchanged, only rows whose parent
        changed are copied, in place: the arrays are this step's outputs, nobody else holds them."""
        if len(rows) != self.batch or not all(isinstance(t, np.ndarray) for t in self.past):
            return self.take(rows)  # rows come or go, or device tensors: a gather
        changed = np.flatnonzero(rows != np.arange(self.batch))
        if len(changed):
            source = rows[changed]
            for tensor in self.past:
                tensor[changed] = tensor[source]  # the right side is a copy: overlapping rows are safe
            self.mask[changed] = self.mask[source]
        return self

    @staticmethod
    def concat(caches: list[KVCache]) -> KVCache:
        return KVCache(*_stack_padded([c.mask for c in caches], [c.past for c in caches], left=True))


@dataclass(frozen=True)
class CrossState:
    """The encoder output a translator decoder row attends to, computed once per source."""

    mask: np.ndarray  # [B, Ssrc] int64, right padded
    kv: list[Tensor]  # 2L tensors [B, H, Ssrc, Dh]

    def feeds(self) -> dict[str, Tensor]:
        feeds: dict[str, Tensor] = {ENCODER_ATTENTION_MASK: self.mask}
        feeds.update(zip(kv_names(CROSS, len(self.kv) // 2), self.kv, strict=True))
        return feeds

    def take(self, rows: np.ndarray) -> CrossState:
        if _is_identity(rows, self.mask.shape[0]):
            return self
        mask = self.mask[rows]
        end = int(mask.sum(axis=1).max()) if len(rows) else 0
        return CrossState(mask[:, :end], [to_numpy(t)[rows, :, :end] for t in self.kv])

    @staticmethod
    def concat(states: list[CrossState]) -> CrossState:
        return CrossState(*_stack_padded([s.mask for s in states], [s.kv for s in states], left=False))
