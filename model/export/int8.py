"""ONNX passes that need neither torch nor the rest of model/: fp16 weight storage and dynamic int8.

model/export/graphs.py uses them at export time. The Dockerfile runs this file alone (onnx + onnxruntime) to
build the int8 variants that are not committed (large imported models), at image build time:

    python model/export/int8.py artifacts/      # adds <role>.int8.onnx where config.json has "int8_file": null
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

FP16_MIN_ELEMENTS = 1024  # small tensors (biases, LayerNorm) stay fp32: no gain, some risk
FP16_SUFFIX = "__fp16"


def store_initializers_fp16(path: Path, keep_float: Collection[str] = ()) -> None:
    """Rewrite large fp32 initializers as fp16 + Cast(to=float): half the bytes, same values (those named in
    ``keep_float`` stay fp32)."""
    m = onnx.load(str(path))
    graph, casts, kept = m.graph, [], []
    for init in graph.initializer:
        large = init.data_type == onnx.TensorProto.FLOAT and int(np.prod(init.dims)) >= FP16_MIN_ELEMENTS
        if large and init.name not in keep_float:
            half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name + FP16_SUFFIX)
            kept.append(half)
            casts.append(helper.make_node("Cast", [half.name], [init.name], to=onnx.TensorProto.FLOAT))
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def fold_constant_transposes(m: onnx.ModelProto) -> onnx.ModelProto:
    """Replace Transpose(initializer) with a pre-transposed initializer.

    The tied LM head reads the embedding through a Transpose; the quantizer only
    quantizes MatMuls whose weight is a constant, so it would skip the largest one.
    """
    graph = m.graph
    inits = {i.name: i for i in graph.initializer}
    keep = []
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            array = numpy_helper.to_array(inits[node.input[0]])
            transposed = np.ascontiguousarray(array.transpose(perm))
            graph.initializer.append(numpy_helper.from_array(transposed, node.output[0]))
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    return m


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of the MatMul weights (activations quantized on the fly, CPU)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folded = dst.with_suffix(".folded.onnx")
    onnx.save(fold_constant_transposes(onnx.load(str(src))), str(folded))
    try:
        quantize_dynamic(str(folded), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    finally:
        folded.unlink()


def restore_fp32_initializers(m: onnx.ModelProto) -> onnx.ModelProto:
    """Undo ``store_initializers_fp16``: each fp16 initializer + Cast becomes the fp32 initializer again
    (the quantizer only quantizes MatMuls whose weight is an initializer)."""
    graph = m.graph
    halves = {i.name: i for i in graph.initializer if i.name.endswith(FP16_SUFFIX)}
    keep = []
    for node in graph.node:
        if node.op_type == "Cast" and node.input[0] in halves:
            array = numpy_helper.to_array(halves.pop(node.input[0])).astype(np.float32)
            graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        else:
            keep.append(node)
    kept_inits = [i for i in graph.initializer if not i.name.endswith(FP16_SUFFIX)]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    del graph.node[:]
    graph.node.extend(keep)
    return m


def add_int8_variants(artifacts_dir: Path) -> list[Path]:
    """Quantize every graph whose config.json has ``"int8_file": null``; returns the files written. An artifact
    whose weights come from a package (``weights_package``: the graph file holds none) is left as it is."""
    written = []
    for config_path in sorted(artifacts_dir.glob("*/config.json")):
        config = json.loads(config_path.read_text())
        folder = config_path.parent
        if "weights_package" in config:
            print(f"{folder.name}: its weights come from {config['weights_package']['distribution']}; no int8 variant")
            continue
        if config.get("export", {}).get("quantization"):  # model/export/quantize.py: its graphs are quantized already
            continue
        for role, graph in config["graphs"].items():
            if graph.get("int8_file"):
                continue
            fp32 = folder / f"{role}.fp32.tmp.onnx"
            onnx.save(restore_fp32_initializers(onnx.load(str(folder / graph["file"]))), str(fp32))
            try:
                target = folder / f"{role}.int8.onnx"
                quantize_int8(fp32, target)
                store_initializers_fp16(target)  # the embedding Gather stays float
            finally:
                fp32.unlink()
            graph["int8_file"] = target.name
            written.append(target)
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    return written


if __name__ == "__main__":
    for path in add_int8_variants(Path(sys.argv[1])):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
