"""Leave a graph's weights in the installed package they came from: every float initializer that equals
a tensor of the package's safetensors file (exactly, or its transpose) becomes ONNX external data at a
location that does not exist, and config.json's ``weights_package`` says which tensor fills it. The server
(contract/weights_package.py) finds the file in the installed distribution, checks its version and
sha256, and hands the tensors to ONNX Runtime with SessionOptions.add_external_initializers."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import set_external_data
from safetensors.numpy import load_file

LOCATION = "weights_package"  # the external-data location: no such file exists, the server supplies the data


def package_file(distribution: str, version: str, file: str) -> Path:
    dist = metadata.distribution(distribution)
    if dist.version != version:
        raise RuntimeError(f"{distribution} {dist.version} is installed, not {version}: "
                           f"pip install {distribution}=={version}")
    return Path(str(dist.locate_file(file)))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _key(array: np.ndarray) -> tuple[tuple[int, ...], str, bytes]:
    contiguous = np.ascontiguousarray(array, dtype=np.float32)
    return contiguous.shape, "float32", hashlib.sha256(contiguous.tobytes()).digest()


def externalize(graph_path: Path, distribution: str, version: str, file: str) -> dict[str, Any]:
    """Rewrite ``graph_path`` with the package's tensors as external references; returns config.json's
    ``weights_package`` object. Initializers that match nothing (small constants, folded tensors) stay inside."""
    path = package_file(distribution, version, file)
    index: dict[tuple[tuple[int, ...], str, bytes], tuple[str, bool]] = {}
    for name, tensor in load_file(str(path)).items():
        if tensor.dtype != np.float32 or tensor.size < 2:
            continue
        index.setdefault(_key(tensor), (name, False))
        if tensor.ndim == 2:
            index.setdefault(_key(tensor.T), (name, True))
    model = onnx.load(str(graph_path))
    initializers: dict[str, dict[str, Any]] = {}
    for init in model.graph.initializer:
        if init.data_type != TensorProto.FLOAT:
            continue
        match = index.get(_key(numpy_helper.to_array(init)))
        if match is None:
            continue
        if not init.HasField("raw_data"):  # set_external_data needs the bytes in raw_data form
            init.raw_data = numpy_helper.to_array(init).tobytes()
            del init.float_data[:]
        set_external_data(init, LOCATION)
        init.ClearField("raw_data")
        init.data_location = TensorProto.EXTERNAL
        initializers[init.name] = {"tensor": match[0], "transpose": match[1]}
    onnx.save(model, str(graph_path))
    return {"distribution": distribution, "version": version, "file": file, "sha256": sha256_of(path),
            "initializers": initializers}
