"""The scoring head: the committed graph is what model/export/scoring_graph.py builds, and it ranks as the
beam search needs (log-softmax values, best first, ties to the lower token id)."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.tokens.sampling import log_softmax
from service.runtime.scoring_head import GRAPH, TopLogprobs


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


def _passthrough_decoder() -> bytes:
    """A stand-in decoder: its input x [batch, seq, vocab] comes out as its logits, with the head appended."""
    import onnx
    from onnx import TensorProto, helper

    from model.export.scoring_graph import OPSET, append_head

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["logits"])], "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "vocab"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", "vocab"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    append_head(model)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def test_the_appended_head_ranks_the_last_position_as_the_standalone_head() -> None:
    pytest.importorskip("onnx")
    import onnxruntime as ort

    session = ort.InferenceSession(_passthrough_decoder(), providers=["CPUExecutionProvider"])
    logits = np.random.default_rng(1).normal(size=(4, 3, 50)).astype(np.float32)
    logits[1, -1, [3, 20, 21]] = 8.0  # a three-way tie at the top of the last position
    logits[2, -1, :] = 0.0  # a whole row of ties
    for k in (1, 6, 50):
        values, ids = session.run(["top_logprobs", "top_ids"], {"x": logits, "k": np.array([k])})
        expected = TopLogprobs()(logits[:, -1], k)
        np.testing.assert_array_equal(values, expected[0])
        np.testing.assert_array_equal(ids, expected[1])
        assert ids[1, :3].tolist() == [3, 20, 21][:k] and ids[2].tolist() == list(range(k))
    for feeds in ({"x": logits}, {"x": logits, "k": np.array([0])}):  # the default, 0: nothing computed
        values, ids = session.run(["top_logprobs", "top_ids"], feeds)
        assert values.size == ids.size == 0


def test_the_exported_translator_decoder_heads_its_own_logits(tiny_artifacts) -> None:
    """top_logprobs/top_ids of the exported decoder (float and int8) are LogSoftmax + TopK of the last
    position of its own logits, bit for bit, for any k up to the vocabulary; k defaults to 0 (empty)."""
    import json

    import onnxruntime as ort

    from contract.golden import golden_inputs
    from contract.names import TensorSpec

    folder = tiny_artifacts / "translator"
    config = json.loads((folder / "config.json").read_text())
    graph = config["graphs"]["decoder"]
    assert {"name": "k", "dtype": "int64", "shape": [1], "default": 0} in graph["inputs"]
    specs = [TensorSpec(i["name"], i["dtype"], tuple(i["shape"]), i.get("default")) for i in graph["inputs"]]
    feeds = golden_inputs(config["vocab_size"], specs)
    for file in (graph["file"], graph["int8_file"]):
        session = ort.InferenceSession(str(folder / file), providers=["CPUExecutionProvider"])
        for k in (1, 5, config["vocab_size"]):
            logits, values, ids = session.run(["logits", "top_logprobs", "top_ids"], feeds | {"k": np.array([k])})
            expected = TopLogprobs()(logits[:, -1], k)
            np.testing.assert_array_equal(values, expected[0])
            np.testing.assert_array_equal(ids, expected[1])
        assert session.run(["top_ids"], feeds)[0].size == 0
