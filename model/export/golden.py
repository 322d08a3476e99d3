"""Golden records: a fixed input per graph and what ONNX Runtime returned for it at export time, the
graph files' sha256, the tokenizer's ids for sample texts, and config.json's fields that no graph run
checks (contract/golden.py says what each section catches).

Torch-free on purpose: tests/export re-runs the committed graphs with ONNX Runtime alone and compares,
so a broken or stale artifact fails CI, and the server checks the same records at start-up.

    python -m model.export.golden --add artifacts/translator   # add the tokenizer, config and files sections to
                                                        # an existing golden.json; its graph outputs stay
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from contract.golden import (
    CONFIG,
    FILES,
    GOLDEN_FILE,
    TOKENIZER,
    load_served_tokenizer,
    record_config,
    record_files,
    record_tokenizer,
    summarize,
)
from contract.golden import golden_inputs as _golden_inputs
from contract.names import ATTENTIONS, TensorSpec
from contract.weights_package import WEIGHTS_PACKAGE, parse_weights_package

__all__ = ["GOLDEN_FILE", "add_records", "golden_inputs", "open_session", "record_golden", "run_graph", "summarize"]


def golden_inputs(config: dict[str, Any], graph: dict[str, Any]) -> dict[str, np.ndarray]:
    """The fixed inputs of one graph of config.json (contract.golden.golden_inputs)."""
    specs = [TensorSpec(i["name"], i["dtype"], tuple(i["shape"]), i.get("default")) for i in graph["inputs"]]
    return _golden_inputs(config["vocab_size"], specs)


def run_graph(folder: Path, role: str, file_key: str = "file") -> tuple[list[str], list[np.ndarray]]:
    config = json.loads((folder / "config.json").read_text())
    graph = config["graphs"][role]
    session = open_session(folder, graph[file_key], config)
    names = [o["name"] for o in graph["outputs"]]
    return names, session.run(names, golden_inputs(config, graph))


def open_session(folder: Path, file: str, config: dict[str, Any]) -> ort.InferenceSession:
    """A CPU session on one graph of the folder; a weights-package artifact gets the package's weights filled in."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    weights = package_weights(config, folder)
    if weights:
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()]
        options.add_external_initializers(list(weights), values)
    return ort.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])


def package_weights(config: dict[str, Any], folder: Path) -> dict[str, np.ndarray]:
    """The initializers config.json's ``weights_package`` fills from an installed package (none without one)."""
    if WEIGHTS_PACKAGE not in config:
        return {}
    return parse_weights_package(config[WEIGHTS_PACKAGE], str(folder / "config.json")).load()


def records(folder: Path) -> dict[str, Any]:
    """The tokenizer, config and files sections (the tokenizer as the server loads it)."""
    config = json.loads((folder / "config.json").read_text())
    tokenizer = load_served_tokenizer(folder / str(config.get("tokenizer", "tokenizer.json")))
    special_tokens = {role: token_id for role, token_id in config["special_tokens"].items()
                      if isinstance(token_id, int)}
    return {
        TOKENIZER: record_tokenizer(tokenizer, config["task"], special_tokens),
        CONFIG: record_config(config),
        FILES: record_files(folder, config["graphs"]),
    }


def record_golden(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    golden: dict[str, Any] = {}
    for role in config["graphs"]:
        names, outputs = run_graph(folder, role)
        golden[role] = {name: summarize(out) for name, out in zip(names, outputs, strict=False)
                        if not name.startswith(ATTENTIONS)}
    golden |= records(folder)
    (folder / GOLDEN_FILE).write_text(json.dumps(golden, indent=1) + "\n")


def add_records(folder: Path) -> None:
    """Add (or replace) the tokenizer, config and files sections of an existing golden.json; its graph
    sections stay as the export wrote them. Run it on a folder whose files are the export's (tests/export
    checks its graphs against their recorded outputs): start-up checks later files against the record."""
    path = folder / GOLDEN_FILE
    golden = json.loads(path.read_text())
    golden |= records(folder)
    path.write_text(json.dumps(golden, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--add", type=Path, nargs="+", required=True, metavar="FOLDER",
                        help="artifact folders whose golden.json gets the tokenizer, config and files sections")
    for folder in parser.parse_args().add:
        add_records(folder)
        print(f"{folder / GOLDEN_FILE}: recorded the tokenizer, config and graph files")


if __name__ == "__main__":
    main()
