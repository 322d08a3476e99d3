"""Next-token selection for one sequence: penalties, temperature, top-k, top-p, and a per-request RNG.

The RNG belongs to the request (seeded by `seed`), never to the batch, so a request draws the same
tokens whether it runs alone or next to others.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # CTRL-style, over prompt and generated tokens
    presence_penalty: float = 0.0  # OpenAI-style, over generated tokens
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def new_seed() -> int:
    return secrets.randbits(63)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (last axis)."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    result: np.ndarray = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return result


class Sampler:
    """Turns one row of logits into a token id; keeps the token counts the penalties need."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: Iterable[int] = ()) -> None:
        self.params = params
        self.seed = params.seed if params.seed is not None else new_seed()
        self.rng = np.random.default_rng(self.seed)
        self.counts = np.zeros(vocab_size, dtype=np.int32)  # generated tokens
        self.seen = np.zeros(vocab_size, dtype=bool)  # prompt or generated
        prompt = np.fromiter(prompt_ids, dtype=np.int64)
        self.seen[prompt[(prompt >= 0) & (prompt < vocab_size)]] = True
        self.bias: np.ndarray | None = None
        if params.logit_bias:
            self.bias = np.zeros(vocab_size, dtype=np.float64)
            for token, value in params.logit_bias.items():
                self.bias[token] = value

    def observe(self, token: int) -> None:
        self.counts[token] += 1
        self.seen[token] = True

    def select(self, logits: np.ndarray) -> int:
        """Pick the next token from a [V] row of raw logits."""
        p = self.params
        x = logits.astype(np.float64)  # a copy: the penalties below work in place
        if self.bias is not None:
            x += self.bias
        if p.repetition_penalty != 1.0:
            hit = x[self.seen]
            x[self.seen] = np.where(hit > 0, hit / p.repetition_penalty, hit * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            x -= self.counts * p.frequency_penalty + (self.counts > 0) * p.presence_penalty
        if p.greedy:
            return int(np.argmax(x))
        if p.temperature != 1.0:
            x *= 1.0 / p.temperature
        candidates = None  # None: the whole vocabulary, in order
        if 0 < p.top_k < x.shape[0]:
            # Back to vocabulary order: argpartition's order can flip on logits that differ by 1e-7.
            candidates = np.sort(np.argpartition(-x, p.top_k - 1)[: p.top_k])
            x = x[candidates]
        probs = np.exp(x - x.max(), out=x)  # unnormalized: the draw scales by the total
        if p.top_p < 1.0:
            ids = np.arange(x.shape[0]) if candidates is None else candidates
            order = np.lexsort((ids, -probs))
            cumulative = np.cumsum(probs[order])
            keep = int(np.searchsorted(cumulative, p.top_p * cumulative[-1])) + 1
            candidates, probs = ids[order[:keep]], probs[order[:keep]]
        cdf = np.cumsum(probs)
        index = min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right")), len(cdf) - 1)
        return index if candidates is None else int(candidates[index])
