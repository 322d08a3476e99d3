"""Kneser-Ney n-gram LM on a synthetic token stream."""

from __future__ import annotations

import numpy as np
import pytest

from model.training.ngram import KneserNeyLM

VOCAB = 30


@pytest.fixture(scope="module")
def stream() -> np.ndarray:
    """A sparse Markov chain, so context matters."""
    rng = np.random.default_rng(0)
    transitions = rng.dirichlet(np.full(VOCAB, 0.1), size=VOCAB)
    ids = [0]
    for _ in range(6000):
        ids.append(int(rng.choice(VOCAB, p=transitions[ids[-1]])))
    return np.array(ids)


@pytest.fixture(scope="module")
def lm(stream: np.ndarray) -> KneserNeyLM:
    return KneserNeyLM(VOCAB).fit(stream[:5000])


def test_perplexity_finite_and_lower_in_distribution(lm: KneserNeyLM, stream: np.ndarray) -> None:
    held_out = stream[5000:]
    shuffled = np.random.default_rng(1).permutation(held_out)
    ppl = lm.perplexity(held_out)
    assert np.isfinite(ppl) and 1 < ppl < lm.perplexity(shuffled)


@pytest.mark.parametrize("context", [[], [3], [3, 4], [29, 29, 29, 29]])
def test_distribution_sums_to_one(lm: KneserNeyLM, context: list[int]) -> None:
    probs = lm.next_token_probs(context)
    assert probs.shape == (VOCAB,) and (probs > 0).all()
    assert probs.sum() == pytest.approx(1.0, abs=1e-9)


def test_log_probs_match_distribution(lm: KneserNeyLM) -> None:
    ids = [5, 7, 2, 9]
    assert np.exp(lm.log_probs(ids)[-1]) == pytest.approx(lm.next_token_probs(ids[:-1])[ids[-1]])


def test_unseen_token_has_probability() -> None:
    lm = KneserNeyLM(10, order=2).fit([1, 2, 1, 2, 1, 2])
    assert np.isfinite(lm.perplexity([1, 2, 9, 1]))
