"""Per-row arrays that follow a batch's rows: `take` keeps (or repeats) rows, `concat` stacks batches.

A field may be None when no row of the batch needs it (a dense [B, V] table nobody reads); stacking it
with a batch that has it fills zeros for the rows that do not.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Self

import numpy as np


@dataclass(frozen=True)
class RowArrays:
    """Base for dataclasses whose fields are all arrays (or None) indexed by batch row on axis 0; the
    first field is never None."""

    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))

    def take(self, rows: np.ndarray) -> Self:
        return replace(self, **{f.name: _take(getattr(self, f.name), rows) for f in fields(self)})

    @classmethod
    def concat(cls, parts: list[Self]) -> Self:
        sizes = [len(p) for p in parts]
        return cls(**{f.name: _concat([getattr(p, f.name) for p in parts], sizes) for f in fields(cls)})


def _take(value: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return None if value is None else value[rows]


def _concat(values: list[np.ndarray | None], sizes: list[int]) -> np.ndarray | None:
    template = next((v for v in values if v is not None), None)
    if template is None:
        return None
    filled = [
        v if v is not None else np.zeros((n, *template.shape[1:]), template.dtype)
        for v, n in zip(values, sizes, strict=True)
    ]
    return np.concatenate(filled)


def objects(items: list[object]) -> np.ndarray:
    """A 1-D object array (np.array would try to stack sequences)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
