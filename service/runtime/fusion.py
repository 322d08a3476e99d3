"""Fused self-attention, built when a session loads.

Our exporter writes each self-attention as some twenty ONNX nodes: three projections, their reshapes and
transposes, a decoder's KV concatenation, both attention matmuls, scale, mask, softmax and the heads'
merge. For a few tokens those nodes cost ONNX Runtime more in per-node overhead than in arithmetic, and
its own optimizer does not recognize them. This pass rewrites each such attention as one
``com.microsoft.MultiHeadAttention`` node (a decoder's with the same past/present contract; an encoder's
mask, [B, 1, 1, T], expanded over the queries as the node wants), and the three projections of its input
as one matmul (split after it, their biases added inside the attention). The result computes the same
numbers (the same kernels, summed in the same order).

The fused attention returns no probabilities, so the rewritten graph lacks the ``attentions.*`` outputs
of the layers it fused; ``GraphSession`` runs the original graph for a call that asks for them.

A graph that does not show the pattern (an imported graph with rotary positions, grouped-query heads or
relative position biases, cross-attention) keeps those nodes: only exact matches are rewritten. Weights kept
as external data (a weights package) are read from ``weights`` where the projections are merged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Fusion:
    """What a rewrite did."""

    attentions: int  # self-attentions rewritten
    merged_projections: int  # of them, those whose Q, K and V projections became one matmul
    dropped_outputs: frozenset[str]  # the fused layers' probability outputs


@dataclass(frozen=True)
class FusedGraph:
    model: onnx.ModelProto
    fusion: Fusion


@dataclass(frozen=True)
class _Attention:
    q: str  # [B, S, D] projections, heads not yet split
    k: str
    v: str
    bias: str  # additive mask: [B, 1, S, T] with a cache, [B, 1, 1, T] without
    out: str  # [B, S, D], heads merged
    probs: str  # the softmax output
    scale: float
    num_heads: int
    past_k: str = ""  # with a KV cache: its inputs and outputs
    past_v: str = ""
    present_k: str = ""
    present_v: str = ""

    @property
    def cached(self) -> bool:
        return bool(self.past_k)


class _Graph:
    """Producers, consumers and constant values of a graph's tensors."""

    def __init__(self, graph: onnx.GraphProto, weights: Mapping[str, np.ndarray]) -> None:
        self.graph = graph
        self.weights = weights  # external initializers' values (a weights package's)
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}

    def made_by(self, name: str, op: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op and node.domain in ("", "ai.onnx") else None

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant, through Casts (fp16-stored weights); None otherwise."""
        if name in self.initializers:
            tensor = self.initializers[name]
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                return self.weights.get(name)
            return numpy_helper.to_array(tensor)
        node = self.producer.get(name)
        if node is None:
            return None
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        if node.op_type == "Cast":
            value, to = self.constant(node.input[0]), _attr(node, "to")
            if value is None or not isinstance(to, int):
                return None
            return value.astype(helper.tensor_dtype_to_np_dtype(to))
        return None

    def only_used_by(self, name: str, *nodes: onnx.NodeProto) -> bool:
        return {id(n) for n in self.consumers.get(name, [])} <= {id(n) for n in nodes}


def _attr(node: onnx.NodeProto, name: str) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _perm(node: onnx.NodeProto | None) -> list[int] | None:
    """A Transpose node's permutation (None for anything else)."""
    perm = _attr(node, "perm") if node is not None and node.op_type == "Transpose" else None
    return [int(p) for p in perm] if isinstance(perm, list) else None


def _heads_of(g: _Graph, reshape: onnx.NodeProto) -> int | None:
    """The third entry of a Reshape's target [B, S, heads, Dh]: a constant, or the third part of a Concat
    whose first two are the batch and sequence sizes."""
    shape = g.constant(reshape.input[1])
    parts = g.made_by(reshape.input[1], "Concat")
    if shape is not None:
        heads = shape.reshape(-1)[2:3] if shape.size == 4 else None
    else:
        heads = g.constant(parts.input[2]) if parts is not None and len(parts.input) == 4 else None
    return int(heads.reshape(())) if heads is not None and heads.size == 1 else None


def _heads_split(g: _Graph, name: str, heads: int, perm: tuple[int, ...] = (0, 2, 1, 3)) -> str | None:
    """``name`` = Transpose(Reshape(x, [B, S, heads, Dh]), perm): x [B, S, D] split into ``heads`` heads
    (transposed to [B, H, S, Dh], or with perm (0, 2, 3, 1) to keys' [B, H, Dh, S]); return x."""
    transpose = g.made_by(name, "Transpose")
    reshape = None if transpose is None or _perm(transpose) != list(perm) else g.made_by(transpose.input[0], "Reshape")
    if reshape is None or _heads_of(g, reshape) != heads:
        return None
    return str(reshape.input[0])


def _match(g: _Graph, softmax: onnx.NodeProto) -> _Attention | None:
    """The self-attention around ``softmax``, or None unless it is exactly our exporter's pattern: with a
    KV cache (decoders: past + this call's keys and values, concatenated) or without (encoders)."""
    if _attr(softmax, "axis") not in (-1, 3):
        return None
    masked = g.made_by(softmax.input[0], "Add")
    if masked is None:
        return None
    scaled = g.made_by(masked.input[0], "Div") or g.made_by(masked.input[0], "Mul")
    if scaled is None:
        return None
    factor = g.constant(scaled.input[1])
    scores = g.made_by(scaled.input[0], "MatMul")
    if factor is None or factor.size != 1 or scores is None:
        return None
    scale = 1.0 / float(factor.reshape(())) if scaled.op_type == "Div" else float(factor.reshape(()))
    readers = g.consumers.get(softmax.output[0], [])
    if len(readers) != 1 or readers[0].op_type != "MatMul" or readers[0].input[0] != softmax.output[0]:
        return None
    weighted = readers[0]
    merged_t = g.consumers.get(weighted.output[0], [])
    if len(merged_t) != 1 or _perm(merged_t[0]) != [0, 2, 1, 3]:
        return None
    merged = g.consumers.get(merged_t[0].output[0], [])
    if len(merged) != 1 or merged[0].op_type != "Reshape":
        return None
    keys_t = g.made_by(scores.input[1], "Transpose")
    if keys_t is None or not g.only_used_by(keys_t.output[0], scores):
        return None
    common = {"bias": masked.input[1], "out": merged[0].output[0], "probs": softmax.output[0], "scale": scale}
    if _perm(keys_t) == [0, 2, 3, 1]:  # no cache: keys split into heads and transposed at once
        reshape = g.made_by(keys_t.input[0], "Reshape")
        heads = None if reshape is None else _heads_of(g, reshape)
        if reshape is None or heads is None or not g.only_used_by(weighted.input[1], weighted):
            return None
        query, value = _heads_split(g, scores.input[0], heads), _heads_split(g, weighted.input[1], heads)
        if query is None or value is None:
            return None
        return _Attention(q=query, k=str(reshape.input[0]), v=value, num_heads=heads, **common)
    concat_k, concat_v = g.made_by(keys_t.input[0], "Concat"), g.made_by(weighted.input[1], "Concat")
    if _perm(keys_t) != [0, 1, 3, 2] or concat_k is None or concat_v is None:
        return None
    for concat in (concat_k, concat_v):
        if _attr(concat, "axis") not in (2, -2) or len(concat.input) != 2:
            return None
    past = [i for i in g.graph.input if i.name == concat_k.input[0]]
    dims = past[0].type.tensor_type.shape.dim if past else []
    if len(dims) != 4 or not dims[1].HasField("dim_value"):
        return None
    heads = int(dims[1].dim_value)  # the cache's heads: the queries' too (no grouped-query sharing)
    q = _heads_split(g, scores.input[0], heads)
    k, v = _heads_split(g, concat_k.input[1], heads), _heads_split(g, concat_v.input[1], heads)
    if q is None or k is None or v is None:
        return None
    # The concatenated caches must feed this attention only (and the graph's present outputs).
    if not (g.only_used_by(concat_k.output[0], keys_t) and g.only_used_by(concat_v.output[0], weighted)):
        return None
    cache = {"past_k": concat_k.input[0], "past_v": concat_v.input[0]}
    present = {"present_k": concat_k.output[0], "present_v": concat_v.output[0]}
    return _Attention(q=q, k=k, v=v, num_heads=heads, **common, **cache, **present)


def _projections(g: _Graph, a: _Attention) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(input, [D, 3D] weights, [3D] biases) when q, k and v are MatMul + Add of one input with constants."""
    parts = []
    for name in (a.q, a.k, a.v):
        add = g.made_by(name, "Add")
        if add is None or len(g.consumers.get(name, [])) != 1:  # read by the heads' split only
            return None
        matmul = g.made_by(add.input[0], "MatMul")
        if matmul is None:
            return None
        weight, bias = g.constant(matmul.input[1]), g.constant(add.input[1])
        if weight is None or bias is None or weight.ndim != 2 or bias.ndim != 1:
            return None
        parts.append((matmul.input[0], weight, bias))
    if len({p[0] for p in parts}) != 1:
        return None
    weights = np.concatenate([p[1] for p in parts], axis=1).astype(np.float32)
    return parts[0][0], weights, np.concatenate([p[2] for p in parts]).astype(np.float32)


def fuse_attention(model: onnx.ModelProto, weights: Mapping[str, np.ndarray] | None = None) -> FusedGraph | None:
    """``model`` rewritten in place (see the module's docstring), or None, leaving it untouched, when no
    attention matched. ``weights``: the values of initializers the graph keeps as external data (a weights
    package)."""
    g = _Graph(model.graph, weights or {})
    found = [a for node in list(model.graph.node) if node.op_type == "Softmax" for a in [_match(g, node)] if a]
    if not found:
        return None
    new_nodes: list[onnx.NodeProto] = []
    expanded: dict[str, str] = {}  # an encoder's mask -> that mask over every query
    merged = 0
    for i, a in enumerate(found):
        q, k, v, bias = a.q, a.k, a.v, ""
        packed = _projections(g, a)
        if packed is not None:
            source, matrix, biases = packed
            names = [f"fused_qkv_{i}.{part}" for part in ("weight", "bias", "split")]
            split = np.full(3, matrix.shape[1] // 3, dtype=np.int64)
            for name, value in zip(names, (matrix, biases, split), strict=True):
                model.graph.initializer.append(numpy_helper.from_array(value, name))
            q, k, v = (f"fused_qkv_{i}.{part}" for part in ("q", "k", "v"))
            new_nodes += [
                helper.make_node("MatMul", [source, names[0]], [f"fused_qkv_{i}"], name=f"fused_qkv_{i}"),
                helper.make_node("Split", [f"fused_qkv_{i}", names[2]], [q, k, v], axis=-1, name=f"fused_split_{i}"),
            ]
            bias, merged = names[1], merged + 1
        attention_bias = a.bias
        if not a.cached:  # the mask's [B, 1, 1, T] broadcast over the queries: the fused node wants [B, 1, S, T]
            if a.bias not in expanded:
                expanded[a.bias] = f"fused_mask_{i}"
                new_nodes += _expand_over_queries(a.bias, q, expanded[a.bias])
            attention_bias = expanded[a.bias]
        cache = [a.past_k, a.past_v] if a.cached else []
        new_nodes.append(
            helper.make_node(
                "MultiHeadAttention",
                [q, k, v, bias, "", attention_bias, *cache],
                [a.out, *([a.present_k, a.present_v] if a.cached else [])],
                domain=MS_DOMAIN,
                num_heads=a.num_heads,
                scale=a.scale,
                name=f"fused_attention_{i}",
            )
        )
    replaced = {name for a in found for name in (a.out, a.present_k, a.present_v) if name}
    kept = [n for n in model.graph.node if not set(n.output) & replaced]
    dropped = frozenset(a.probs for a in found if a.probs in g.outputs)
    outputs = [o for o in model.graph.output if o.name not in dropped]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    _replace_nodes(model.graph, kept + new_nodes)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return FusedGraph(model, Fusion(len(found), merged, dropped))


def _expand_over_queries(mask: str, queries: str, out: str) -> list[onnx.NodeProto]:
    """Nodes that broadcast ``mask`` [B, 1, 1, T] to [B, 1, S, T], S read from ``queries`` [B, S, D]."""
    return [
        helper.make_node("Shape", [queries], [f"{out}.queries"], start=1, end=2),
        helper.make_node("Constant", [], [f"{out}.ones"], value_ints=[1, 1]),
        helper.make_node("Constant", [], [f"{out}.one"], value_ints=[1]),
        helper.make_node("Concat", [f"{out}.ones", f"{out}.queries", f"{out}.one"], [f"{out}.shape"], axis=0),
        helper.make_node("Expand", [mask, f"{out}.shape"], [out]),
    ]


def _replace_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """The nodes the outputs need, in topological order; unused initializers dropped."""
    producer = {out: n for n in nodes for out in n.output}
    needed: dict[int, onnx.NodeProto] = {}
    stack = [o.name for o in graph.output]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed[id(node)] = node
            stack.extend(name for name in node.input if name)
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ordered: list[onnx.NodeProto] = []
    pending = [n for n in nodes if id(n) in needed]
    while pending:
        waiting = []
        for n in pending:
            if all(name in ready for name in n.input):
                ordered.append(n)
                ready.update(n.output)
            else:
                waiting.append(n)
        if len(waiting) == len(pending):
            raise ValueError("fused graph has a cycle or a missing input")
        pending = waiting
    used = {name for n in ordered for name in n.input}
    inputs = {i.name for i in graph.input}
    initializers = [t for t in graph.initializer if t.name in used or t.name in inputs]
    del graph.node[:]
    graph.node.extend(ordered)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
