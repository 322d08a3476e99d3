"""Load trained weights: from a run folder (runs/<model>/) or back out of an exported artifact.

A fresh machine has no runs/ folder, only what is in git. ``weights_from_artifact`` recovers the
PyTorch weights from the committed ONNX graphs, so training can continue from them. The exporter
renames most weight matrices (a transposed constant becomes ``val_123``), so the mapping is found by
exporting a randomly initialized copy of the same architecture with the same exporter: walking both
graphs node by node pairs up their initializers, and each initializer of the random copy equals
exactly one parameter (or its transpose).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from contract.names import LOGITS_TO_KEEP, TOP_K
from model.export.graphs import export_graph, export_model
from model.kinds import config_from_dict, load_config, model_kind
from model.network.config import TransformerConfig
from model.training.loop import load_weights

FP16_SUFFIX = "__fp16"  # model/export/graphs.py stores large initializers as <name>__fp16 + Cast


def load_trained(kind: str, run_dir: Path, weights: str = "best") -> nn.Module:
    config = load_config(run_dir / "config.json")
    model = model_kind(kind).build(config)
    load_weights(model, run_dir / f"{weights}.safetensors")
    return model.eval()


def export_checkpoint(kind: str, run_dir: Path, out_dir: Path, int8: bool = True, weights: str = "best") -> None:
    """runs/<kind>/ (config.json, <weights>.safetensors, tokenizer.json, card.*) -> artifacts/<kind>/."""
    model = load_trained(kind, run_dir, weights)
    export_model(kind, model, run_dir / "tokenizer.json", out_dir, card_dir=run_dir, int8=int8)


def artifact_config(artifact_dir: Path) -> TransformerConfig:
    """The training config of an exported model, from its card (the serving config.json has only dims)."""
    data = dict(json.loads((artifact_dir / "card.json").read_text())["config"])
    return config_from_dict(data)


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers as fp32 arrays under their graph names (fp16-stored ones under the name of their Cast)."""
    out = {}
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        name = init.name.removesuffix(FP16_SUFFIX)
        out[name] = array.astype(np.float32) if array.dtype == np.float16 else array
    return out


def _computation(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The graph's nodes without the Casts that the fp16 storage put in front."""
    return [n for n in model.graph.node if not (n.op_type == "Cast" and n.input[0].endswith(FP16_SUFFIX))]


def _name_map(reference: onnx.ModelProto, trained: onnx.ModelProto) -> dict[str, str]:
    """Reference initializer name -> the trained graph's name for the same input of the same node.

    Equal initializers are merged at export (a fresh model's LayerNorm weights are all ones), so names
    can differ between two exports of one architecture; the node sequence does not.
    """
    ref_nodes, trained_nodes = _computation(reference), _computation(trained)
    if [n.op_type for n in ref_nodes] != [n.op_type for n in trained_nodes]:
        raise ValueError("the artifact's graph differs from this code's export of the same architecture")
    names: dict[str, str] = {}
    for ref_node, trained_node in zip(ref_nodes, trained_nodes, strict=False):
        for ref_input, trained_input in zip(ref_node.input, trained_node.input, strict=False):
            names.setdefault(ref_input, trained_input)
    return names


def _newest_variant(artifact_dir: Path) -> bool:
    """Whether the artifact's graphs were exported with their optional inputs (the generator's
    ``logits_to_keep``, the translator decoder's scoring head and its ``k``): the reference export must be
    the same variant, node for node."""
    graphs = json.loads((artifact_dir / "config.json").read_text())["graphs"].values()
    return any(i["name"] in (LOGITS_TO_KEEP, TOP_K) for graph in graphs for i in graph["inputs"])


def _digest(array: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


def weights_from_artifact(kind: str, artifact_dir: Path) -> tuple[nn.Module, list[str]]:
    """Rebuild the PyTorch model of ``artifacts/<kind>/`` from its ONNX graphs (fp16-rounded weights).

    Returns the model and the names of the parameters no graph uses (the classifier's pretraining
    heads), which keep their random initialization.
    """
    torch.manual_seed(1234)
    model = model_kind(kind).build(artifact_config(artifact_dir))
    model.eval()
    params = dict(model.named_parameters())  # tied weights appear once, under their first name
    with torch.no_grad():  # distinct random values everywhere: equal initializers (LayerNorm ones) would be merged
        for p in params.values():
            p.normal_()
    canonical = {alias: name for name, p in params.items()
                 for alias, q in model.named_parameters(remove_duplicate=False) if q is p}
    by_digest: dict[str, tuple[str, bool]] = {}
    for name, p in params.items():
        value = p.detach().numpy()
        by_digest.setdefault(_digest(value), (name, False))
        if value.ndim == 2:
            by_digest.setdefault(_digest(value.T), (name, True))
    recovered: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in model_kind(kind).graphs(model, _newest_variant(artifact_dir)):
            reference_path = Path(tmp) / f"{spec.role}.onnx"
            export_graph(spec, reference_path)
            reference = onnx.load(str(reference_path))
            trained_graph = onnx.load(str(artifact_dir / f"{spec.role}.onnx"))
            trained, trained_name = _initializers(trained_graph), _name_map(reference, trained_graph)
            for graph_name, array in _initializers(reference).items():
                if graph_name.removeprefix("model.") in canonical:  # kept its name (biases, LayerNorms)
                    match: tuple[str, bool] | None = (canonical[graph_name.removeprefix("model.")], False)
                elif array.dtype == np.float32:  # renamed (transposed matrices): found by value
                    match = by_digest.get(_digest(array))
                else:
                    match = None
                if match is None:
                    continue  # a constant of the graph (shapes, scales, the sinusoidal table), not a parameter
                name, transposed = match
                source = trained.get(trained_name.get(graph_name, graph_name))
                if source is None:
                    raise ValueError(f"{artifact_dir / spec.role}.onnx has no initializer for {name} ({graph_name})")
                tensor = torch.from_numpy(source.T.copy() if transposed else source.copy())
                recovered.setdefault(name, tensor)
    with torch.no_grad():
        for name, tensor in recovered.items():
            params[name].copy_(tensor)
    return model, sorted(set(params) - set(recovered))


def reexport_artifact(kind: str, artifact_dir: Path, out_dir: Path | None = None) -> dict[str, object]:
    """Export ``artifacts/<kind>/`` again with this exporter, from the weights its own graphs hold
    (``weights_from_artifact``): new graph features without a training run. The card, learning curve and
    tokenizer are carried over, an int8 variant is written where the artifact had one; ``out_dir``
    defaults to the artifact folder itself (replaced once the new export is complete)."""
    config = json.loads((artifact_dir / "config.json").read_text())
    model, _ = weights_from_artifact(kind, artifact_dir)
    int8 = any(graph.get("int8_file") for graph in config["graphs"].values())
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / kind
        exported = export_model(kind, model, artifact_dir / "tokenizer.json", staging, card_dir=artifact_dir,
                                int8=int8, name=config["name"])
        target = out_dir or artifact_dir
        target.mkdir(parents=True, exist_ok=True)
        for path in staging.iterdir():
            shutil.copyfile(path, target / path.name)
    return exported
