"""The scoring head: the committed graph is what model/export/scoring_graph.py builds, and it ranks as the
beam search needs (log-softmax values, best first, ties to the lower token id)."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.sampling import log_softmax
from service.engine.top_logprobs import GRAPH, TopLogprobs


def test_the_committed_graph_is_what_the_builder_builds() -> None:
    pytest.importorskip("onnx")  # the training extra
    from model.export.scoring_graph import build

    assert GRAPH.read_bytes() == build(), "run: python -m model.export.scoring_graph"


def test_top_logprobs_are_the_best_log_softmax_values_with_ties_to_the_lower_id() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 300)).astype(np.float32)
    logits[2, [7, 40, 41]] = 9.0  # a three-way tie at the top
    values, ids = TopLogprobs()(logits, 6)
    assert values.shape == ids.shape == (5, 6)
    expected = log_softmax(logits)
    order = np.argsort(-expected, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_allclose(values, np.take_along_axis(expected, order, axis=1), atol=1e-5)
    assert ids[2, :3].tolist() == [7, 40, 41]


def test_k_beyond_the_vocabulary_is_the_whole_row() -> None:
    values, ids = TopLogprobs()(np.zeros((2, 4), dtype=np.float32), 10)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2
    np.testing.assert_allclose(values, np.log(0.25), atol=1e-6)
