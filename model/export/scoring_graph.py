"""Builds the server's scoring head, service/runtime/scoring_head.onnx: a row-wise log-softmax over the
vocabulary and the k best tokens of each row (ONNX TopK: best first, ties to the lower token id), as one
ONNX Runtime call. Beam search ranks those candidates instead of sorting [rows, vocab] in numpy.

It is independent of any model (every artifact, imported ones too, feeds it its logits), so it is built
once here, where `onnx` is installed, and committed; tests/export/test_scoring_graph.py checks that the
committed file is what this builds. `append_head` puts the same two nodes at the end of an exported
translator decoder (its optional ``top_logprobs``/``top_ids`` outputs), so a beam step fetches [rows, k]
instead of copying out [rows, vocab] logits and calling this graph.

    python -m model.export.scoring_graph        # rewrites service/runtime/scoring_head.onnx
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

from contract.names import LOGITS, TOP_IDS, TOP_K, TOP_LOGPROBS

PATH = Path(__file__).resolve().parents[2] / "service" / "runtime" / "scoring_head.onnx"
OPSET = 20
HEAD_OUTPUTS = (TOP_LOGPROBS, TOP_IDS)
_PREFIX = "top_k_head."  # names of the appended head's tensors


def head_nodes(logits: str, logprobs: str, values: str, ids: str) -> list[NodeProto]:
    """LogSoftmax over the last axis, then TopK (largest, sorted: ties go to the lower index) with k = TOP_K."""
    return [
        helper.make_node("LogSoftmax", [logits], [logprobs], axis=-1),
        helper.make_node("TopK", [logprobs, TOP_K], [values, ids], axis=-1, largest=1, sorted=1),
    ]


def build() -> bytes:
    graph = helper.make_graph(
        head_nodes(LOGITS, "logprobs", TOP_LOGPROBS, TOP_IDS),
        "top_logprobs",
        [
            helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["rows", "vocab"]),
            helper.make_tensor_value_info(TOP_K, TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info(TOP_LOGPROBS, TensorProto.FLOAT, ["rows", "k"]),
            helper.make_tensor_value_info(TOP_IDS, TensorProto.INT64, ["rows", "k"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="model.scoring_graph")
    model.ir_version = 9  # what onnxruntime 1.32 reads for opset 20
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def append_head(model: onnx.ModelProto) -> None:
    """Add the input TOP_K ([1] int64) and the outputs TOP_LOGPROBS, TOP_IDS ([batch, k]) to a decoder
    graph whose ``logits`` are [batch, seq, vocab]: the head of the last position's logits.

    ONNX Runtime runs every node whatever the caller fetches, so the head reads the last position of
    min(k, 1) * batch rows: with k = 0 (the input's default) it computes nothing and
    callers that read only the logits pay nothing. (Not an If: onnxruntime's quantizer sorts nodes without
    seeing what a subgraph reads from the graph around it.)"""
    g, p = model.graph, _PREFIX
    logits = next(o for o in g.output if o.name == LOGITS)
    batch = logits.type.tensor_type.shape.dim[0].dim_param or "batch"
    g.initializer.extend([
        numpy_helper.from_array(np.zeros(1, dtype=np.int64), TOP_K),  # k's default: an input's initializer
        numpy_helper.from_array(np.ones(1, dtype=np.int64), f"{p}one"),
        numpy_helper.from_array(np.array([0, -1], dtype=np.int64), f"{p}starts"),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], dtype=np.int64), f"{p}to_end"),
        numpy_helper.from_array(np.array([0, 1], dtype=np.int64), f"{p}axes"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), f"{p}seq_axis"),
    ])
    g.node.extend([
        helper.make_node("Shape", [LOGITS], [f"{p}batch"], start=0, end=1),
        helper.make_node("Min", [TOP_K, f"{p}one"], [f"{p}wanted"]),
        helper.make_node("Mul", [f"{p}batch", f"{p}wanted"], [f"{p}rows"]),
        helper.make_node("Concat", [f"{p}rows", f"{p}to_end"], [f"{p}ends"], axis=0),
        helper.make_node("Slice", [LOGITS, f"{p}starts", f"{p}ends", f"{p}axes"], [f"{p}last"]),
        helper.make_node("Squeeze", [f"{p}last", f"{p}seq_axis"], [f"{p}logits"]),
        *head_nodes(f"{p}logits", f"{p}logprobs", TOP_LOGPROBS, TOP_IDS),
    ])
    g.input.append(helper.make_tensor_value_info(TOP_K, TensorProto.INT64, [1]))
    g.output.extend([
        helper.make_tensor_value_info(TOP_LOGPROBS, TensorProto.FLOAT, [batch, "k"]),
        helper.make_tensor_value_info(TOP_IDS, TensorProto.INT64, [batch, "k"]),
    ])


def main() -> None:
    PATH.write_bytes(build())
    print(f"wrote {PATH} ({PATH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
