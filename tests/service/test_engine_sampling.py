import numpy as np

from service.engine.sampling import Sampler, SamplingParams, log_softmax

V = 50


def logits(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=V).astype(np.float32)


def test_greedy_is_argmax() -> None:
    x = logits()
    assert Sampler(SamplingParams(temperature=0.0), V).select(x) == int(np.argmax(x))


def test_same_seed_same_tokens() -> None:
    a, b = Sampler(SamplingParams(seed=7), V), Sampler(SamplingParams(seed=7), V)
    draws_a = [a.select(logits(i)) for i in range(20)]
    draws_b = [b.select(logits(i)) for i in range(20)]
    assert draws_a == draws_b
    other = Sampler(SamplingParams(seed=8), V)
    assert [other.select(logits(i)) for i in range(20)] != draws_a


def test_draw_is_stable_under_tiny_logit_noise() -> None:
    """Batched logits differ from unbatched ones by ~1e-6; the draw must not change."""
    for seed in range(20):
        x = logits(seed)
        noisy = x + np.random.default_rng(100 + seed).normal(scale=1e-6, size=V).astype(np.float32)
        params = SamplingParams(seed=seed, top_k=10, top_p=0.9)
        assert Sampler(params, V).select(x) == Sampler(params, V).select(noisy)


def test_top_k_1_and_tiny_top_p_are_greedy() -> None:
    x = logits(3)
    best = int(np.argmax(x))
    assert Sampler(SamplingParams(top_k=1, seed=1), V).select(x) == best
    assert Sampler(SamplingParams(top_p=1e-6, seed=1), V).select(x) == best


def test_top_k_only_draws_from_the_k_best() -> None:
    x = logits(4)
    allowed = set(np.argsort(-x)[:3].tolist())
    sampler = Sampler(SamplingParams(top_k=3, seed=0), V)
    assert {sampler.select(x) for _ in range(200)} <= allowed


def test_repetition_penalty_discourages_seen_tokens() -> None:
    x = np.zeros(V, dtype=np.float32)
    x[5], x[6] = 2.0, 1.9
    sampler = Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.5), V, prompt_ids=[5])
    assert sampler.select(x) == 6


def test_frequency_penalty_and_logit_bias() -> None:
    x = np.zeros(V, dtype=np.float32)
    x[1] = 1.0
    sampler = Sampler(SamplingParams(temperature=0.0, frequency_penalty=2.0), V)
    sampler.observe(1)
    assert sampler.select(x) != 1
    assert Sampler(SamplingParams(temperature=0.0, logit_bias={9: 100.0}), V).select(x) == 9


def test_log_softmax_normalizes() -> None:
    lp = log_softmax(np.stack([logits(0), logits(1)]))
    np.testing.assert_allclose(np.exp(lp).sum(axis=-1), 1.0, rtol=1e-9)
