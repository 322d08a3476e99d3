"""Builds the server's scoring head, service/engine/top_logprobs.onnx: a row-wise log-softmax over the
vocabulary and the k best tokens of each row (ONNX TopK: best first, ties to the lower token id), as one
ONNX Runtime call. Beam search ranks those candidates instead of sorting [rows, vocab] in numpy.

It is independent of any model (every artifact, imported ones too, feeds it its logits), so it is built
once here, where `onnx` is installed, and committed; tests/export/test_scoring_graph.py checks that the
committed file is what this builds.

    python -m model.export.scoring_graph        # rewrites service/engine/top_logprobs.onnx
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from contract.names import LOGITS, TOP_IDS, TOP_K, TOP_LOGPROBS

PATH = Path(__file__).resolve().parents[1] / "service" / "engine" / "top_logprobs.onnx"
OPSET = 20


def build() -> bytes:
    graph = helper.make_graph(
        [
            helper.make_node("LogSoftmax", [LOGITS], ["logprobs"], axis=-1),
            helper.make_node("TopK", ["logprobs", TOP_K], [TOP_LOGPROBS, TOP_IDS], axis=-1, largest=1, sorted=1),
        ],
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


def main() -> None:
    PATH.write_bytes(build())
    print(f"wrote {PATH} ({PATH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
