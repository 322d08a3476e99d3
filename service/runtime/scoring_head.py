"""Each row's k most likely next tokens and their log-probabilities, from the scoring head graph
(scoring_head.onnx, built by model/export/scoring_graph.py): ONNX Runtime's LogSoftmax and TopK over [64, 8000]
take 0.4 ms on one thread, numpy's float32 log-softmax and argpartition 1.1 ms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from contract.names import LOGITS, TOP_IDS, TOP_K, TOP_LOGPROBS

GRAPH = Path(__file__).with_name("scoring_head.onnx")


class TopLogprobs:
    def __init__(self) -> None:
        # On the calling thread alone: a thread pool of its own would spin beside the decoder's after
        # each call and slow the next decoder run (measured: 4.6 -> 7.2 ms per beam step at 64 rows).
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(GRAPH), sess_options=options, providers=["CPUExecutionProvider"])

    def __call__(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """([R, k] float32 log-probabilities, [R, k] int64 token ids), best first; ties: lower id first."""
        k = min(k, logits.shape[-1])
        feeds = {LOGITS: np.ascontiguousarray(logits, dtype=np.float32), TOP_K: np.array([k], dtype=np.int64)}
        logprobs, ids = self.session.run([TOP_LOGPROBS, TOP_IDS], feeds)
        return logprobs, ids
