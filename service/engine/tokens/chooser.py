"""Next-token choice for a whole batch at once: logit bias, repetition / frequency / presence penalties,
temperature, top-k, top-p, a seeded draw, and logprobs; float32, one pass per step, no per-row loops.

Each row's settings and token counts are arrays indexed by batch row (`ChooserRows`), taken and stacked
with the batch. The uniform number a row draws at its step t is a splitmix64 hash of (seed, t): it
depends on nothing else in the batch, and every row is computed as if alone, so a row given the same
logits chooses the same token in any batch. The model's logits themselves differ in their last bits
between batch shapes (ONNX Runtime sums in another order); the draw walks the kept tokens in vocabulary
order, so such noise cannot reorder candidates: it only moves the boundaries between neighbouring
tokens' cumulative mass, and a draw whose uniform lies within the noise of a boundary takes the
neighbour (docs/api.md, "Generate"). Logprobs are those of the model (raw logits), computed only for rows
that ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.engine.tokens.rows import RowArrays
from service.engine.tokens.sampling import SamplingParams, logsumexp, new_seed

TOP_P_WINDOW = 256  # top-p looks for its cut among this many most likely tokens first
_ONE = np.uint64(1)
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 arrays (wrapping arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    result: np.ndarray = z ^ (z >> np.uint64(31))
    return result


def uniforms(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """One float64 in [0, 1) per row, a function of (seed, step) only."""
    with np.errstate(over="ignore"):
        bits = splitmix64(splitmix64(seeds.astype(np.uint64)) + steps.astype(np.uint64))
    result: np.ndarray = (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return result


@dataclass(frozen=True)
class Choice:
    tokens: np.ndarray  # [B] int64
    logprobs: np.ndarray | None = None  # [B] float32, the chosen token's; NaN in rows that did not ask
    top_ids: np.ndarray | None = None  # [B, K] int64, best first, for rows that asked (`ChooserRows.top`)
    top_logprobs: np.ndarray | None = None  # [B, K] float32


@dataclass(frozen=True)
class ChooserRows(RowArrays):
    temperature: np.ndarray  # [B] float32; 0 is greedy
    top_k: np.ndarray  # [B] int64; 0 is off
    top_p: np.ndarray  # [B] float32
    repetition: np.ndarray  # [B] float32; CTRL-style, over prompt and generated tokens
    presence: np.ndarray  # [B] float32; OpenAI-style, over generated tokens
    frequency: np.ndarray  # [B] float32
    seed: np.ndarray  # [B] uint64
    step: np.ndarray  # [B] uint64: tokens drawn so far
    top: np.ndarray  # [B] int64: -1 no logprobs; k >= 0 the chosen token's logprob and the k most likely
    bias: np.ndarray | None  # [B, V] float32, None when no row has a logit bias
    counts: np.ndarray | None  # [B, V] int32 generated tokens, None when no row has a frequency/presence penalty
    seen: np.ndarray | None  # [B, V] bool prompt or generated tokens, None when no row has a repetition penalty

    @classmethod
    def create(
        cls,
        params: Sequence[SamplingParams],
        vocab_size: int,
        prompts: Sequence[Sequence[int]] = (),
        logprobs: Sequence[int | None] = (),
    ) -> ChooserRows:
        """Rows for new sequences: `prompts` feed the repetition penalty, `logprobs[i]` as in ChooserRows.top."""
        B, V = len(params), vocab_size

        def column(values: list[float], dtype: type) -> np.ndarray:
            return np.asarray(values, dtype=dtype).reshape(B)

        bias = counts = seen = None
        if any(p.logit_bias for p in params):
            bias = np.zeros((B, V), dtype=np.float32)
            for b, p in enumerate(params):
                for token, value in p.logit_bias.items():
                    bias[b, token] = value
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            counts = np.zeros((B, V), dtype=np.int32)
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = np.zeros((B, V), dtype=bool)
            for b, prompt in enumerate(prompts):
                ids = np.asarray(prompt, dtype=np.int64)
                seen[b, ids[(ids >= 0) & (ids < V)]] = True
        asked = list(logprobs) or [None] * B
        return cls(
            temperature=column([p.temperature for p in params], np.float32),
            top_k=column([min(p.top_k, V) for p in params], np.int64),  # k >= V keeps all: any int fits int64
            top_p=column([p.top_p for p in params], np.float32),
            repetition=column([p.repetition_penalty for p in params], np.float32),
            presence=column([p.presence_penalty for p in params], np.float32),
            frequency=column([p.frequency_penalty for p in params], np.float32),
            seed=np.asarray([p.seed if p.seed is not None else new_seed() for p in params], dtype=np.uint64),
            step=np.zeros(B, dtype=np.uint64),
            top=column([-1 if k is None else k for k in asked], np.int64),
            bias=bias,
            counts=counts,
            seen=seen,
        )

    def observe(self, tokens: np.ndarray) -> None:
        """Count the chosen tokens (the arrays are updated in place: they belong to this batch)."""
        if self.counts is not None:
            self.counts[np.arange(len(tokens)), tokens] += 1
        if self.seen is not None:
            self.seen[np.arange(len(tokens)), tokens] = True
        self.step[:] += _ONE


def choose(
    rows: ChooserRows,
    logits: np.ndarray,
    banned: tuple[np.ndarray, np.ndarray] | None = None,
    allowed: np.ndarray | None = None,
) -> Choice:
    """Pick every row's next token from [B, V] raw logits, never a `banned` (rows, tokens) pair and only
    where `allowed` ([B, V] bool, a grammar's mask; every row must allow a token) is true (the caller then
    calls `rows.observe`). Few [B, V] temporaries: each costs page faults at this size."""
    changed = rows.bias is not None or rows.counts is not None or rows.seen is not None
    if not (changed or banned is not None or allowed is not None or rows.temperature.any()):
        tokens = np.argmax(logits, axis=1)  # every row greedy: one argmax
        return _with_logprobs(rows, logits, tokens) if (rows.top >= 0).any() else Choice(tokens)
    x = _penalized(rows, logits, banned)
    if allowed is not None:
        x[~allowed] = -np.inf
    tokens = np.argmax(x, axis=1)
    sampled = np.flatnonzero(rows.temperature > 0)
    if len(sampled):
        tokens[sampled] = _draw(rows, sampled, x if len(sampled) == len(x) else x[sampled])
    return _with_logprobs(rows, logits, tokens)


def _penalized(rows: ChooserRows, logits: np.ndarray, banned: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """A float32 copy of the logits with bias, penalties and bans; the penalties touch only the
    (row, token) pairs they concern."""
    x = np.array(logits, dtype=np.float32)
    if rows.bias is not None:
        x += rows.bias
    if rows.seen is not None:
        r, t = np.nonzero(rows.seen & (rows.repetition != 1.0)[:, None])
        hit, penalty = x[r, t], rows.repetition[r]
        x[r, t] = np.where(hit > 0, hit / penalty, hit * penalty)
    if rows.counts is not None:
        r, t = np.nonzero(rows.counts)
        counts = rows.counts[r, t]
        x[r, t] -= counts * rows.frequency[r] + rows.presence[r]
    if banned is not None:
        x[banned] = -np.inf
    return x


def _draw(rows: ChooserRows, sampled: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Sampled rows [S, V] of penalized logits (overwritten) -> token ids: temperature, top-k, top-p,
    inverse CDF."""
    S, V = x.shape
    x /= rows.temperature[sampled, None]
    k, p = rows.top_k[sampled], rows.top_p[sampled]
    cut = np.flatnonzero(((k > 0) & (k < V)) | (p < 1.0))
    dropped = None
    if len(cut):
        kept = x if len(cut) == S else x[cut]
        dropped = kept < _thresholds(kept, k[cut], p[cut])[:, None]
    x -= x.max(axis=1, keepdims=True)
    probs = np.exp(x, out=x)  # unnormalized: the draw scales by the total
    if dropped is not None:
        if len(cut) == S:
            probs[dropped] = 0.0
        else:
            probs[cut] = np.where(dropped, 0.0, probs[cut])
    return _inverse_cdf(probs, uniforms(rows.seed[sampled], rows.step[sampled]))


def _thresholds(x: np.ndarray, k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per row, the smallest logit top-k and top-p keep (ties at the cut stay). Both look at the most likely
    tokens only (one partition); top-p sorts a whole row only when its cut lies beyond TOP_P_WINDOW."""
    n, V = x.shape
    by_k = (k > 0) & (k < V)
    width = min(V, int(np.where(by_k, k, np.where(p < 1.0, TOP_P_WINDOW, 1)).max()))
    best = -np.sort(np.partition(-x, width - 1, axis=1)[:, :width], axis=1)  # [n, width], descending
    allowed = np.where(by_k, np.minimum(k, width), width)
    threshold = np.where(by_k, best[np.arange(n), allowed - 1], -np.inf)
    nucleus = np.flatnonzero(p < 1.0)
    if not len(nucleus):
        return threshold
    top = best[nucleus, :1]
    mass = np.exp(best[nucleus] - top)
    mass[np.arange(width)[None, :] >= allowed[nucleus, None]] = 0.0
    total = mass.sum(axis=1)
    whole = np.flatnonzero(~by_k[nucleus])  # without top-k the nucleus is a share of the whole row
    if len(whole):
        rest = x[nucleus[whole]] - top[whole]
        total[whole] = np.exp(rest, out=rest).sum(axis=1)
    cumulative = np.cumsum(mass, axis=1)
    goal = p[nucleus] * total
    for i in np.flatnonzero(cumulative[:, -1] < goal).tolist():  # rare: the cut lies beyond the window
        row = -np.sort(-x[nucleus[i]])
        whole = np.cumsum(np.exp(row - row[0]))
        threshold[nucleus[i]] = row[min(int((whole < goal[i]).sum()), V - 1)]
    inside = cumulative[:, -1] >= goal
    cut = best[nucleus, np.minimum((cumulative < goal[:, None]).sum(axis=1), width - 1)]
    threshold[nucleus[inside]] = np.maximum(threshold[nucleus[inside]], cut[inside])
    return threshold


def _inverse_cdf(probs: np.ndarray, u: np.ndarray, block: int = 64) -> np.ndarray:
    """Row r's token where its cumulative mass first passes u[r] * total, in vocabulary order.

    Two levels (block sums, then one block) instead of a cumsum over the whole vocabulary, which numpy
    does slowly; the index is kept on a token of nonzero mass whatever the rounding."""
    S, V = probs.shape
    padded = (probs if V % block == 0 else np.pad(probs, ((0, 0), (0, (-V) % block)))).reshape(S, -1, block)
    sums = padded.sum(axis=2)
    cumulative = np.cumsum(sums, axis=1)
    target = (u * cumulative[:, -1]).astype(np.float32)
    rows = np.arange(S)
    chosen = np.minimum((cumulative <= target[:, None]).sum(axis=1), sums.shape[1] - 1)
    inside = padded[rows, chosen]  # [S, block]
    local = target - (cumulative[rows, chosen] - sums[rows, chosen])
    index = (np.cumsum(inside, axis=1) <= local[:, None]).sum(axis=1)
    nonzero = inside > 0
    first, last = np.argmax(nonzero, axis=1), block - 1 - np.argmax(nonzero[:, ::-1], axis=1)
    result: np.ndarray = chosen * block + np.clip(index, first, last)
    return result


def _with_logprobs(rows: ChooserRows, logits: np.ndarray, tokens: np.ndarray) -> Choice:
    """The model's logprobs (raw logits) of the chosen and the most likely tokens, for rows that ask."""
    asked = np.flatnonzero(rows.top >= 0)
    if not len(asked):
        return Choice(tokens)
    x = logits if len(asked) == len(logits) else logits[asked]
    lse = logsumexp(x)
    chosen = np.full(len(tokens), np.nan, dtype=np.float32)
    chosen[asked] = x[np.arange(len(asked)), tokens[asked]] - lse
    K = min(int(rows.top[asked].max()), x.shape[1])
    if K <= 0:
        return Choice(tokens, chosen)
    top_ids = np.full((len(tokens), K), -1, dtype=np.int64)
    top_lp = np.full((len(tokens), K), np.nan, dtype=np.float32)
    ids = np.sort(np.argpartition(-x, K - 1, axis=1)[:, :K], axis=1)  # by id, then stably by value: ties by id
    values = np.take_along_axis(x, ids, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    top_ids[asked] = np.take_along_axis(ids, order, axis=1)
    top_lp[asked] = np.take_along_axis(values, order, axis=1) - lse[:, None]
    return Choice(tokens, chosen, top_ids, top_lp)
