"""model/export/int8.py: int8 variants added after export (the Dockerfile's int8 stage), with onnx and ONNX
Runtime alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from model.export.golden import run_graph
from model.export.int8 import add_int8_variants


def test_graphs_committed_without_int8_get_one(tiny_artifacts: Path, tmp_path: Path) -> None:
    folder = tmp_path / "classifier"
    shutil.copytree(tiny_artifacts / "classifier", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / config["graphs"]["encoder"]["int8_file"]).unlink()
    config["graphs"]["encoder"]["int8_file"] = None
    (folder / "config.json").write_text(json.dumps(config))

    written = add_int8_variants(tmp_path)

    assert written == [folder / "encoder.int8.onnx"]
    assert json.loads((folder / "config.json").read_text())["graphs"]["encoder"]["int8_file"] == "encoder.int8.onnx"
    names, fp32 = run_graph(folder, "encoder")
    _, int8 = run_graph(folder, "encoder", "int8_file")
    logits = names.index("logits")
    assert np.abs(int8[logits] - fp32[logits]).max() < 0.05  # quantized weights, same function
    assert add_int8_variants(tmp_path) == []  # nothing left to do
