"""The batch-wide token chooser: each row behaves as if alone, seeded draws, penalties, logprobs."""

import numpy as np
import pytest

from service.engine.tokens.chooser import ChooserRows, choose, uniforms
from service.engine.tokens.sampling import SamplingParams, log_softmax

V = 50


def logits(seed: int = 0, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, V)).astype(np.float32)


def draws(params: SamplingParams, steps: int, seed: int = 0, prompt: tuple[int, ...] = ()) -> list[int]:
    rows = ChooserRows.create([params], V, [prompt])
    out = []
    for i in range(steps):
        token = choose(rows, logits(seed + i))
        rows.observe(token.tokens)
        out.append(int(token.tokens[0]))
    return out


def test_greedy_is_argmax() -> None:
    x = logits(rows=4)
    rows = ChooserRows.create([SamplingParams(temperature=0.0)] * 4, V)
    assert choose(rows, x).tokens.tolist() == np.argmax(x, axis=1).tolist()


def test_same_seed_same_tokens_and_another_seed_others() -> None:
    params = SamplingParams(seed=7)
    assert draws(params, 20) == draws(params, 20)
    assert draws(SamplingParams(seed=8), 20) != draws(params, 20)


def test_a_row_draws_the_same_alone_or_batched_in_any_position() -> None:
    """Rows of different settings side by side: each row's tokens are the tokens it draws alone."""
    settings = [
        SamplingParams(seed=1),
        SamplingParams(temperature=0.0, repetition_penalty=1.4),
        SamplingParams(temperature=0.7, top_k=5, seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, seed=3, frequency_penalty=0.5),
        SamplingParams(top_k=10, top_p=0.5, seed=4, presence_penalty=1.0, logit_bias={3: 2.0}),
    ]
    alone = []
    for p in settings:
        rows = ChooserRows.create([p], V, [[1, 2]], [2])
        tokens = []
        for step in range(15):
            c = choose(rows, logits(step, len(settings))[settings.index(p)][None])
            rows.observe(c.tokens)
            assert c.logprobs is not None and c.top_ids is not None
            tokens.append((int(c.tokens[0]), float(c.logprobs[0]), c.top_ids[0].tolist()))
        alone.append(tokens)
    order = [3, 0, 4, 2, 1]
    rows = ChooserRows.create([settings[i] for i in order], V, [[1, 2]] * 5, [2] * 5)
    together: list[list[tuple[int, float, list[int]]]] = [[] for _ in order]
    for step in range(15):
        c = choose(rows, logits(step, len(settings))[order])
        rows.observe(c.tokens)
        assert c.logprobs is not None and c.top_ids is not None
        for b, i in enumerate(order):
            together[i].append((int(c.tokens[b]), float(c.logprobs[b]), c.top_ids[b].tolist()))
    assert together == alone


def test_rows_follow_take_and_concat() -> None:
    a = ChooserRows.create([SamplingParams(seed=1), SamplingParams(seed=2, frequency_penalty=1.0)], V)
    b = ChooserRows.create([SamplingParams(seed=3, logit_bias={4: 1.0})], V)
    a.observe(np.array([5, 6]))
    both = ChooserRows.concat([a, b])
    assert both.seed.tolist() == [1, 2, 3] and both.step.tolist() == [1, 1, 0]
    assert both.counts is not None and both.counts[1, 6] == 1 and both.counts[2].sum() == 0
    assert both.bias is not None and both.bias[2, 4] == 1.0 and not both.bias[:2].any()
    last = both.take(np.array([2, 0]))
    assert last.seed.tolist() == [3, 1] and last.seen is None


def test_logit_noise_moves_a_draw_only_to_a_vocabulary_neighbour_at_their_boundary() -> None:
    """The guarantee is bitwise (the test above): the model's logits for a row differ in their last bits
    between batch shapes, and then a draw changes only where its uniform lies within that noise of the
    boundary between two tokens' cumulative mass, which the draw walks in vocabulary order: it takes the
    neighbouring token. Noise of 1e-3 here makes such flips frequent enough to see."""
    scale, flips = 1e-3, 0
    for seed in range(3000):
        x = logits(seed)
        noise = np.random.default_rng(100 + seed).normal(scale=scale, size=V).astype(np.float32)
        rows = ChooserRows.create([SamplingParams(seed=seed)] * 2, V)
        a, b = choose(rows, np.concatenate([x, x + noise])).tokens.tolist()
        if a == b:
            continue
        flips += 1
        assert abs(a - b) == 1, (seed, a, b)
        probs = np.exp(log_softmax(x[0]).astype(np.float64))
        boundary = probs[: max(a, b)].sum()
        u = uniforms(np.array([seed], dtype=np.uint64), np.zeros(1, dtype=np.uint64))[0]
        # Each probability moves by a factor within exp(+-2 max|noise|): the boundary by less than that.
        assert abs(u - boundary) <= 2 * np.abs(noise).max() + 1e-6, (seed, u, boundary)
    assert 0 < flips < 30  # rare even at this noise: ~1e-6 (the real batch noise) makes them far rarer


def test_top_k_beyond_the_vocabulary_keeps_every_token() -> None:
    """Any integer: a top_k past int64 must not overflow the row arrays (it was a 500)."""
    x = logits(3, rows=3)
    rows = ChooserRows.create([SamplingParams(seed=9, top_k=k) for k in (0, V + 1, 2**63)], V)
    assert rows.top_k.tolist() == [0, V, V]
    assert len(set(choose(rows, np.repeat(x[:1], 3, axis=0)).tokens.tolist())) == 1


def test_top_k_1_and_tiny_top_p_are_greedy() -> None:
    for seed in range(10):
        x = logits(seed)
        best = int(np.argmax(x))
        rows = ChooserRows.create([SamplingParams(top_k=1, seed=seed), SamplingParams(top_p=1e-6, seed=seed)], V)
        assert choose(rows, np.concatenate([x, x])).tokens.tolist() == [best, best]


@pytest.mark.parametrize(
    "params", [SamplingParams(top_k=3), SamplingParams(top_p=0.3), SamplingParams(top_k=8, top_p=0.3)]
)
def test_top_k_and_top_p_only_draw_from_their_set(params: SamplingParams) -> None:
    x = logits(4)
    probs = np.exp(log_softmax(x[0]).astype(np.float64))
    order = np.argsort(-probs)
    k = params.top_k or V
    mass = np.cumsum(probs[order[:k]] / probs[order[:k]].sum())
    allowed = set(order[: int(np.searchsorted(mass, params.top_p)) + 1].tolist())
    rows = ChooserRows.create([SamplingParams(**{**params.__dict__, "seed": s}) for s in range(300)], V)
    drawn = set(choose(rows, np.repeat(x, 300, axis=0)).tokens.tolist())
    assert drawn <= allowed and len(drawn) == len(allowed)  # 300 draws reach every allowed token here


def test_sampling_follows_the_distribution() -> None:
    x = logits(5)
    probs = np.exp(log_softmax(x[0]).astype(np.float64))
    rows = ChooserRows.create([SamplingParams(seed=s) for s in range(20000)], V)
    freq = np.bincount(choose(rows, np.repeat(x, 20000, axis=0)).tokens, minlength=V) / 20000
    assert np.abs(freq - probs).max() < 0.02


def test_uniforms_are_uniform_and_depend_on_seed_and_step() -> None:
    u = uniforms(np.arange(100000, dtype=np.uint64), np.zeros(100000, dtype=np.uint64))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert uniforms(np.array([7, 7], dtype=np.uint64), np.array([0, 1], dtype=np.uint64)).tolist() != [u[7]] * 2


def test_repetition_penalty_discourages_seen_tokens() -> None:
    x = np.zeros((1, V), dtype=np.float32)
    x[0, 5], x[0, 6] = 2.0, 1.9
    rows = ChooserRows.create([SamplingParams(temperature=0.0, repetition_penalty=1.5)], V, [[5]])
    assert choose(rows, x).tokens.tolist() == [6]


def test_frequency_penalty_and_logit_bias() -> None:
    x = np.zeros((2, V), dtype=np.float32)
    x[:, 1] = 1.0
    penalized = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    rows = ChooserRows.create([penalized, SamplingParams(temperature=0.0, logit_bias={9: 100.0})], V)
    assert choose(rows, x).tokens.tolist() == [1, 9]
    rows.observe(np.array([1, 9]))
    assert choose(rows, x).tokens[0] != 1


def test_logprobs_are_the_models_and_only_for_rows_that_ask() -> None:
    x = logits(6, rows=3)
    rows = ChooserRows.create([SamplingParams(temperature=0.0, logit_bias={0: 50.0})] * 3, V, logprobs=[None, 0, 3])
    c = choose(rows, x)
    lp = log_softmax(x)
    assert c.tokens.tolist() == [0, 0, 0] and c.logprobs is not None and c.top_ids is not None
    assert c.top_logprobs is not None
    assert np.isnan(c.logprobs[0]) and np.allclose(c.logprobs[1:], lp[1:, 0], atol=1e-6)
    assert c.top_ids[2].tolist() == np.argsort(-lp[2])[:3].tolist()
    assert np.allclose(c.top_logprobs[2], np.sort(lp[2])[::-1][:3], atol=1e-6)


def test_log_softmax_normalizes_in_float32() -> None:
    lp = log_softmax(logits(0, rows=2))
    assert lp.dtype == np.float32
    np.testing.assert_allclose(np.exp(lp.astype(np.float64)).sum(axis=-1), 1.0, rtol=1e-5)
