"""Quantized artifacts: every MatMul weight of every graph as int8 or int4 blocks (ONNX Runtime's
``MatMulNBits``), in the artifact's own graph files, so the server serves them like any other artifact.

Weight-only, block-wise and symmetric (blocks along the input dimension, one fp32 scale each: 128 values for
int8, 32 for int4); with ``accuracy_level`` 4 the kernels quantize each row of activations per block to int8
and multiply in integers (VNNI where the CPU has it). Every row is quantized on its own, so a token's logits
do not depend on the other rows of the batch, and a prefill's last position equals the same position with
``logits_to_keep`` = 1, as the server's start-up checks require. The dynamic-int8 variants
(``int8_file``, model/export/int8.py) quantize the activations per tensor instead: scales shared across the
batch, which those checks only accept from a variant.

The tied LM head (a Transpose of the embedding) is folded into its own initializer first, so it is quantized
too; the embedding table itself (a Gather) stays float, stored as fp16 + Cast where the artifact stores
fp16. Graphs stored as fp16 + Cast are quantized from the fp32 values those hold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from model.export.golden import record_golden
from model.export.int8 import fold_constant_transposes, restore_fp32_initializers, store_initializers_fp16

PRECISIONS = {"int8": 8, "int4": 4}  # --quantize: the bits of each weight
# int8 blocks of 128 process a 1,000-token prompt 1.11x faster than blocks of 32 (SmolLM2-135M shape, ONNX
# Runtime alone, 2 threads: 655 against 589 tok/s; fp32 550). int4 keeps blocks of 32, the size its quality
# cost was measured at (benchmarks/quantized_quality.py).
BLOCK_SIZES = {"int8": 128, "int4": 32}
ACCURACY_LEVEL = 4  # int8 activations and integer dot products: faster than level 0 (fp32) on AVX-512 here
QUANTIZED_OPS = ("MatMulNBits",)


@contextlib.contextmanager
def quiet_quantizer() -> Iterator[None]:
    """The quantizer logs a line per MatMul it skips (attention's two per layer) at INFO."""
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(previous)


def quantization_record(precision: str) -> dict[str, Any]:
    """What config.json's ``export.quantization`` says about a quantized artifact."""
    return {"precision": precision, "op": "com.microsoft.MatMulNBits", "bits": PRECISIONS[precision],
            "block_size": BLOCK_SIZES[precision], "symmetric": True, "accuracy_level": ACCURACY_LEVEL}


def quantize_graph(src: Path, dst: Path, precision: str, fp16_storage: bool) -> None:
    """``src`` (fp32, or fp16 + Cast) -> ``dst`` with every constant-weight MatMul as MatMulNBits."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    model = fold_constant_transposes(restore_fp32_initializers(onnx.load(str(src))))
    config = DefaultWeightOnlyQuantConfig(block_size=BLOCK_SIZES[precision], is_symmetric=True,
                                          accuracy_level=ACCURACY_LEVEL, bits=PRECISIONS[precision])
    with quiet_quantizer():
        quantizer = MatMulNBitsQuantizer(model, algo_config=config)
        quantizer.process()
    quantized = quantizer.model.model
    onnx.save(quantized, str(dst))
    if fp16_storage:  # the embedding table; the blocks' scales stay fp32 (MatMulNBits reads them as A's type)
        scales = {n.input[2] for n in quantized.graph.node if n.op_type in QUANTIZED_OPS}
        store_initializers_fp16(dst, keep_float=scales)


def quantize_artifact(folder: Path, precision: str, fp16_storage: bool = True) -> dict[str, Any]:
    """Quantize every graph of the artifact in ``folder`` in place; config.json records it (without
    dynamic-int8 variants) and golden.json is recorded again from the quantized graphs. Returns the record."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if "weights_package" in config:
        raise ValueError(f"{folder}: its weights come from a package; quantize the checkpoint it was made from")
    if config["export"].get("quantization"):
        raise ValueError(f"{folder}: already quantized ({config['export']['quantization']['precision']})")
    for graph in config["graphs"].values():
        target = folder / graph["file"]
        staged = target.with_suffix(".quantized.onnx")
        quantize_graph(target, staged, precision, fp16_storage)
        staged.replace(target)
        if graph.get("int8_file"):
            (folder / graph["int8_file"]).unlink(missing_ok=True)
        graph["int8_file"] = None
    record = quantization_record(precision)
    config["export"] |= {"quantization": record, "weights_storage": "float16" if fp16_storage else "float32"}
    path.write_text(json.dumps(config, indent=2) + "\n")
    record_golden(folder)
    return record


def quantized_copy(src: Path, dst: Path, precision: str) -> dict[str, Any]:
    """A quantized copy of the artifact ``src`` in ``dst``, served under ``dst``'s name."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    if config["name"] != dst.name:  # the folder name is the served name
        config["name"] = dst.name
        (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return quantize_artifact(dst, precision, config["export"]["weights_storage"] == "float16")

