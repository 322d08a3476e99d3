"""Golden outputs: a fixed input per graph and what ONNX Runtime returned for it at export time.

Torch-free on purpose: tests/export re-runs the committed graphs with ONNX Runtime
alone and compares, so a broken or stale artifact fails CI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.contract.names import (
    ATTENTION_MASK,
    ATTENTIONS,
    ENCODER_ATTENTION_MASK,
    PAST,
    POSITION_IDS,
    TOKEN_TYPE_IDS,
)

GOLDEN_FILE = "golden.json"
BATCH, SEQ, PAST_LEN = 2, 4, 3


def golden_inputs(config: dict[str, Any], graph: dict[str, Any]) -> dict[str, np.ndarray]:
    """Deterministic inputs for every required graph input, sized from the symbolic shapes in config.json
    (optional inputs keep their default, so adding one leaves the golden outputs as they were)."""
    rng = np.random.default_rng(0)
    sizes = {"batch": BATCH, "seq": SEQ, "src": SEQ + 1, "past": PAST_LEN, "total": PAST_LEN + SEQ}
    feeds: dict[str, np.ndarray] = {}
    for spec in graph["inputs"]:
        name = spec["name"]
        if "default" in spec:
            continue
        shape = [sizes.get(d, d) if isinstance(d, str) else d for d in spec["shape"]]
        if name in (ATTENTION_MASK, ENCODER_ATTENTION_MASK):
            feeds[name] = np.ones(shape, dtype=np.int64)
            feeds[name][1, 0] = 0  # one padded position in the second row
        elif name == POSITION_IDS:
            feeds[name] = np.tile(np.arange(shape[1], dtype=np.int64), (shape[0], 1)) + (
                PAST_LEN if any(i["name"].startswith(f"{PAST}.") for i in graph["inputs"]) else 0
            )
        elif name == TOKEN_TYPE_IDS:
            feeds[name] = np.zeros(shape, dtype=np.int64)
            feeds[name][:, shape[1] // 2 :] = 1
        elif spec["dtype"] == "int64":
            feeds[name] = rng.integers(4, config["vocab_size"], size=shape, dtype=np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return _fix_axes(feeds, graph)


def _fix_axes(feeds: dict[str, np.ndarray], graph: dict[str, Any]) -> dict[str, np.ndarray]:
    """attention_mask covers past + new positions in graphs that take a cache."""
    if f"{PAST}.0.key" in feeds:
        feeds[ATTENTION_MASK] = np.ones((BATCH, PAST_LEN + SEQ), dtype=np.int64)
        feeds[ATTENTION_MASK][1, 0] = 0
    return feeds


def run_graph(folder: Path, role: str, file_key: str = "file") -> tuple[list[str], list[np.ndarray]]:
    config = json.loads((folder / "config.json").read_text())
    graph = config["graphs"][role]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(folder / graph[file_key]), options, providers=["CPUExecutionProvider"])
    names = [o["name"] for o in graph["outputs"]]
    return names, session.run(names, golden_inputs(config, graph))


def summarize(array: np.ndarray) -> dict[str, Any]:
    flat = array.reshape(-1).astype(np.float64)
    return {"shape": list(array.shape), "head": flat[:8].tolist(), "sum": float(flat.sum()), "abs_sum": float(np.abs(flat).sum())}


def record_golden(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    golden = {}
    for role in config["graphs"]:
        names, outputs = run_graph(folder, role)
        golden[role] = {name: summarize(out) for name, out in zip(names, outputs) if not name.startswith(ATTENTIONS)}
    (folder / GOLDEN_FILE).write_text(json.dumps(golden, indent=1) + "\n")
