"""When a decoded row stops: its end token (unless ignore_eos), max new tokens, or a stop string.

One rule for generation and translation. The end token ends a sequence but is not one of its tokens:
no token event carries it, and it is not counted in completion/output tokens (OpenAI's usage counts
what the client receives; TGI's `generated_tokens` counts the eos too, we do not). `max_new_tokens`
bounds the tokens drawn, the end token included, so a sequence never needs more positions than that.
With `ignore_eos` the end token is an ordinary (special, textless) token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.engine.tokens.rows import RowArrays
from service.engine.tokens.streaming import TextStream

RUNNING, END, LENGTH = 0, 1, 2  # codes from StopRows.update


@dataclass(frozen=True)
class StopRows(RowArrays):
    max_new: np.ndarray  # [B] int64: most tokens a row may draw, its end token included
    drawn: np.ndarray  # [B] int64: tokens drawn so far
    ignore_eos: np.ndarray  # [B] bool

    @classmethod
    def create(cls, max_new: Sequence[int], ignore_eos: Sequence[bool]) -> StopRows:
        n = len(max_new)
        return cls(np.asarray(max_new, dtype=np.int64), np.zeros(n, dtype=np.int64), np.asarray(ignore_eos, dtype=bool))

    def update(self, tokens: np.ndarray, eos: int | np.ndarray) -> np.ndarray:
        """Count one drawn token per row; return each row's code: RUNNING, END or LENGTH (END wins).
        ``eos``: the end token, or an array of them (a model with several, e.g. Llama 3's)."""
        self.drawn[:] += 1
        codes = np.where(self.drawn >= self.max_new, LENGTH, RUNNING)
        # A model's few end tokens against each row's token: a broadcast compare (np.isin costs ~20 us a step).
        ended = tokens == eos if np.ndim(eos) == 0 else (tokens[:, None] == eos).any(axis=1)
        codes[ended & ~self.ignore_eos] = END
        return codes


def release(text: TextStream, token: int, code: int) -> tuple[str, str | None]:
    """Feed one token to a row's text: the text it releases, and the finish reason (None: running).

    The end token is not fed (it has no text); it releases what the stream still held back."""
    if code == END:
        return text.finish(), "eos"
    piece = text.push(token)
    reason = "stop" if text.stopped else "length" if code == LENGTH else None
    if reason is not None:
        piece += text.finish()
    return piece, reason
