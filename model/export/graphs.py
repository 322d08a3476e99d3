"""PyTorch -> ONNX: the graphs, config.json and golden outputs the server loads (see artifacts/README.md).

Recipe (../shared/design/ARCHITECTURE.md, section 4): dynamo export at opset 20,
example inputs with batch >= 2 and sequence >= 2 (smaller ones can freeze a
reshape), every length dynamic, the KV cache as graph inputs/outputs, int64 ids.
Weights are stored as fp16 initializers followed by a Cast to fp32 (ORT folds
the Cast at load), which halves the files; the PyTorch weights are rounded the
same way first, so the graph and the reference model compute the same function.
Graph roles, files and input/output names come from the contract module (contract/), which
the server imports too; the generator graph's optional ``logits_to_keep`` input gets its default (0,
every position) as an initializer of the same name after export. The translator decoder gets the scoring
head after export (model/export/scoring_graph.py::append_head: ``top_logprobs``, ``top_ids`` for its
optional input ``k``, default 0), the same ONNX nodes as the server's standalone head.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import Tensor, nn
from torch.export import Dim

from contract.kinds import EMBEDDING, KINDS, Task, graph_file, int8_graph_file
from contract.names import IN_PLACE_AXIS, LOGITS, LOGITS_TO_KEEP
from model.export.graph_modules import (
    EncoderGraph,
    GeneratorGraph,
    TranslatorDecoderGraph,
    TranslatorEncoderGraph,
    has_token_type_input,
)
from model.export.int8 import FP16_MIN_ELEMENTS, quantize_int8, store_initializers_fp16
from model.export.scoring_graph import HEAD_OUTPUTS, append_head
from model.network.classifier import Classifier
from model.network.config import ClassifierConfig, GeneratorConfig, TransformerConfig, TranslatorConfig
from model.network.embedder import Embedder
from model.network.generator import Generator
from model.network.translator import Translator

OPSET = 20
FORMAT_VERSION = 1


# --- graph specs: example inputs, names and dynamic axes --------------------------------------------


@dataclass
class GraphSpec:
    """Everything torch.onnx.export needs for one graph, and the defaults of its optional inputs."""

    role: str
    module: nn.Module
    example: tuple[Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: tuple[Any, ...]
    defaults: dict[str, int] = field(default_factory=dict)  # optional input -> its value when not fed
    axis_names: dict[str, dict[int, str]] = field(default_factory=dict)  # output -> axis -> symbolic name
    top_k_head: bool = False  # append the scoring head after export (output_names name its outputs)

    @property
    def traced_outputs(self) -> list[str]:
        """The outputs the traced module returns (the appended head's are not among them)."""
        return [n for n in self.output_names if not (self.top_k_head and n in HEAD_OUTPUTS)]


BATCH, SEQ, PAST, SRC = Dim("batch"), Dim("seq"), Dim("past"), Dim("src")
CAPACITY = Dim(IN_PLACE_AXIS)  # an in-place cache buffer's positions (model/network/in_place.py)


def _ids(vocab: int, B: int, S: int, generator: torch.Generator) -> Tensor:
    return torch.randint(4, vocab, (B, S), generator=generator)


def _dims(config: TransformerConfig) -> dict[str, int]:
    """config.json's dims for this config (model sizes and layer counts; an encoder's token-type rows when
    they differ from BERT's 2, and the key/value heads when fewer than the query heads (grouped-query
    attention): the contract assumes BERT's 2 and n_heads when the keys are absent)."""
    dims = {"d_model": config.d_model, "n_heads": config.n_heads, "d_head": config.d_head, "d_ff": config.d_ff}
    if config.kv_heads != config.n_heads:
        dims["n_kv_heads"] = config.kv_heads
    dims |= {name: getattr(config, name) for name in config.depth_fields}
    if isinstance(config, ClassifierConfig) and config.type_vocab_size != 2:
        dims["n_token_types"] = config.type_vocab_size if has_token_type_input(config) else 0
    return dims


def translator_specs(model: Translator, top_k: bool = True) -> list[GraphSpec]:
    """The encoder and decoder graphs; ``top_k=False`` builds the decoder of artifacts exported before its
    scoring head (the committed translator's)."""
    c, g = model.config, torch.Generator().manual_seed(0)
    B, S, P, Ssrc = 2, 3, 4, 5  # all >= 2 and distinct, so no axis is frozen by coincidence
    src_ids, src_mask = _ids(c.vocab_size, B, Ssrc, g), torch.ones(B, Ssrc, dtype=torch.long)
    src_mask[1, -2:] = 0
    n_dec = c.n_decoder_layers
    cross = [torch.randn(B, c.n_heads, Ssrc, c.d_head, generator=g) for _ in range(2 * n_dec)]
    past = [torch.randn(B, c.n_heads, P, c.d_head, generator=g) for _ in range(2 * n_dec)]
    task = KINDS["translator"].task
    enc_io, dec_io = (task.graph_io(role, _dims(c), top_k=top_k) for role in task.roles)
    encoder = GraphSpec(
        role="encoder",
        module=TranslatorEncoderGraph(model),
        example=(src_ids, src_mask),
        input_names=list(enc_io.inputs),
        output_names=list(enc_io.all_outputs),
        dynamic_shapes=({0: BATCH, 1: SRC}, {0: BATCH, 1: SRC}),
    )
    decoder = GraphSpec(
        role="decoder",
        module=TranslatorDecoderGraph(model),
        example=(
            _ids(c.vocab_size, B, S, g),
            torch.ones(B, P + S, dtype=torch.long),
            torch.arange(P, P + S).expand(B, S).contiguous(),
            src_mask,
            *cross,
            *past,
        ),
        input_names=list(dec_io.inputs),
        output_names=list(dec_io.all_outputs),
        dynamic_shapes=(
            {0: BATCH, 1: SEQ},
            {0: BATCH, 1: Dim("total")},
            {0: BATCH, 1: SEQ},
            {0: BATCH, 1: SRC},
            tuple([{0: BATCH, 2: SRC}] * (2 * n_dec) + [{0: BATCH, 2: PAST}] * (2 * n_dec)),
        ),
        top_k_head=top_k,  # with its input k, default 0: the head computes nothing
    )
    return [encoder, decoder]


def generator_specs(model: Generator, logits_to_keep: bool = True, in_place: bool = False) -> list[GraphSpec]:
    """The decoder graph; ``logits_to_keep=False`` builds the graph of artifacts exported before that input.
    ``in_place``: its cache inputs are buffers of ``capacity`` positions that the graph writes the new keys
    and values into (model/network/in_place.py; no attention maps); else ``present`` = past + new."""
    c, g = model.config, torch.Generator().manual_seed(0)
    B, S, P = 2, 3, 4
    capacity = P + S + 2 if in_place else P  # a buffer holds the past, the new tokens and room to spare
    past = [torch.randn(B, c.kv_heads, capacity, c.d_head, generator=g) for _ in range(2 * c.n_layers)]
    io = KINDS["generator"].task.graph_io("decoder", _dims(c), logits_to_keep)
    keep: tuple[Tensor, ...] = (torch.tensor(1, dtype=torch.long),) if logits_to_keep else ()
    cache_axis = CAPACITY if in_place else PAST
    return [
        GraphSpec(
            role="decoder",
            module=GeneratorGraph(model, logits_to_keep, in_place),
            example=(
                _ids(c.vocab_size, B, S, g),
                torch.ones(B, P + S, dtype=torch.long),
                torch.arange(P, P + S).expand(B, S).contiguous(),
                *past,
                *keep,
            ),
            input_names=[*io.inputs, *io.optional_inputs],
            output_names=list(io.outputs if in_place else io.all_outputs),
            dynamic_shapes=(
                {0: BATCH, 1: SEQ},
                {0: BATCH, 1: Dim("total")},
                {0: BATCH, 1: SEQ},
                tuple([{0: BATCH, 2: cache_axis}] * (2 * c.n_layers) + [None] * len(keep)),
            ),
            defaults={LOGITS_TO_KEEP: 0} if logits_to_keep else {},
            axis_names={LOGITS: {1: "kept"}} if logits_to_keep else {},  # seq, or logits_to_keep of them
        )
    ]


def encoder_specs(model: Classifier | Embedder, task: Task) -> list[GraphSpec]:
    c, g = model.config, torch.Generator().manual_seed(0)
    B, S = 2, 5
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, -2:] = 0
    types = torch.zeros(B, S, dtype=torch.long)
    types[:, 3:] = 1
    io = task.graph_io("encoder", _dims(c))
    token_types = has_token_type_input(c)
    return [
        GraphSpec(
            role="encoder",
            module=EncoderGraph(model),
            example=(_ids(c.vocab_size, B, S, g), *((types,) if token_types else ()), mask),
            input_names=list(io.inputs),
            output_names=list(io.all_outputs),
            dynamic_shapes=({0: BATCH, 1: SEQ}, tuple([{0: BATCH, 1: SEQ}] * (2 if token_types else 1))),
        )
    ]


def classifier_specs(model: Classifier, logits_to_keep: bool = True) -> list[GraphSpec]:
    return encoder_specs(model, KINDS["classifier"].task)


def embedder_specs(model: Embedder, logits_to_keep: bool = True) -> list[GraphSpec]:
    return encoder_specs(model, EMBEDDING)


# --- ONNX passes ------------------------------------------------------------------------------------


def round_weights_to_fp16(model: nn.Module) -> None:
    """Round every large float parameter and buffer (the sinusoidal table) to fp16 precision, in place,
    so the PyTorch model computes exactly what the fp16-stored graph does."""
    with torch.no_grad():
        for p in [*model.parameters(), *model.buffers()]:
            if p.dtype == torch.float32 and p.numel() >= FP16_MIN_ELEMENTS:
                p.copy_(p.half().float())


def describe_io(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Input/output names, dtypes and (symbolic) shapes, read back from the saved graph; an input that is
    also an initializer is optional, and its entry carries the ``default`` the graph uses when it is not fed."""
    m = onnx.load(str(path), load_external_data=False)
    defaults = {i.name: numpy_helper.to_array(i).item() for i in m.graph.initializer if i.name in
                {vi.name for vi in m.graph.input}}

    def values(vis: Any) -> list[dict[str, Any]]:
        out = []
        for vi in vis:
            t = vi.type.tensor_type
            dims = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
            entry = {"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims}
            out.append(entry | ({"default": defaults[vi.name]} if vi.name in defaults else {}))
        return out

    return {"inputs": values(m.graph.input), "outputs": values(m.graph.output)}


def export_graph(spec: GraphSpec, path: Path) -> None:
    torch.onnx.export(
        spec.module,
        spec.example,
        str(path),
        dynamo=True,
        external_data=False,
        opset_version=OPSET,
        input_names=spec.input_names,
        output_names=spec.traced_outputs,
        dynamic_shapes=spec.dynamic_shapes,
        verbose=False,
    )
    if spec.defaults or spec.axis_names or spec.top_k_head:
        finish_graph(path, spec.defaults, spec.axis_names, spec.output_names if spec.top_k_head else None)


def finish_graph(
    path: Path, defaults: dict[str, int], axis_names: dict[str, dict[int, str]], head_order: list[str] | None = None
) -> None:
    """Append the scoring head when ``head_order`` lists the outputs in their contract order. Give graph inputs a
    default: an int64 initializer of the same name, which a caller may override (ONNX IR >= 4) or leave
    out, so callers that do not know the input get the old behaviour. Name the output axes the exporter
    could only describe by a formula (``seq - u0``)."""
    m = onnx.load(str(path))
    if head_order is not None:
        append_head(m)
        by_name = {vi.name: vi for vi in m.graph.output}
        ordered = [by_name[name] for name in head_order]
        del m.graph.output[:]
        m.graph.output.extend(ordered)
    inputs = {vi.name: vi for vi in m.graph.input}
    for name, value in defaults.items():
        shape = [d.dim_value for d in inputs[name].type.tensor_type.shape.dim]
        m.graph.initializer.append(numpy_helper.from_array(np.full(shape, value, dtype=np.int64), name))
    outputs = {vi.name: vi for vi in m.graph.output}
    for name, axes in axis_names.items():
        for axis, symbol in axes.items():
            outputs[name].type.tensor_type.shape.dim[axis].dim_param = symbol
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


# --- the artifact folder ------------------------------------------------------------------------------


def build_config(
    kind: str, config: TransformerConfig, graphs: dict[str, dict[str, Any]], weights_storage: str,
    name: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json; ``extra``: top-level keys of the task (an embedder's pooling, normalize, ...), which may
    replace the defaults (an embedder's max_positions is the input limit its checkpoint was trained to)."""
    import onnxruntime

    from model.kinds import model_kind

    task = model_kind(kind).task
    out: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": name or kind,
        "task": task.name,
        "architecture": task.architecture,
        "dims": _dims(config),
        "vocab_size": config.vocab_size,
        "max_positions": config.max_positions,
        "special_tokens": config.special_tokens,
        "tokenizer": "tokenizer.json",
        "card": "card.json",
        "graphs": graphs,
        "export": {
            "torch": torch.__version__.split("+")[0],
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "opset": OPSET,
            "weights_storage": weights_storage,
        },
    }
    if isinstance(config, ClassifierConfig) and task.labels:
        out["labels"] = list(config.labels)
    if isinstance(config, GeneratorConfig):  # an imported decoder's generation_config.json, where it had one
        if config.eos_token_ids:
            out["eos_token_ids"] = list(config.eos_token_ids)
        if config.generation_defaults:
            out["generation_defaults"] = dict(config.generation_defaults)
        if config.bad_words_ids:
            out["bad_words_ids"] = [list(w) for w in config.bad_words_ids]
    if isinstance(config, TranslatorConfig) and config.languages:  # a multilingual translator (M2M100, NLLB)
        out["languages"] = dict(config.languages)
        if config.forced_bos_token_id is not None:
            out["forced_bos_token_id"] = config.forced_bos_token_id
    return out | (extra or {})


def export_model(
    kind: str,
    model: nn.Module,
    tokenizer_path: Path,
    out_dir: Path,
    card_dir: Path | None = None,
    fp16_storage: bool = True,
    int8: bool = True,
    name: str | None = None,
    in_place_cache: bool = False,
) -> dict[str, Any]:
    """Export ``model`` to ``out_dir`` (graphs, config.json, tokenizer.json, card, golden.json).

    ``name`` is the served model name (default: ``kind``); serve it from a folder of that name.
    ``in_place_cache``: a generator's cache inputs are buffers its graph writes into (model/network/in_place.py:
    no copy of the cache per step, no attention maps); else ``present`` = past + new, with attention maps."""
    from model.export.golden import record_golden
    from model.kinds import model_kind  # the kinds' records name this module's spec builders

    served_name = name or kind
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    if fp16_storage:
        round_weights_to_fp16(model)
    graphs: dict[str, dict[str, Any]] = {}
    options = {"in_place": True} if in_place_cache else {}
    for spec in model_kind(kind).graphs(model, **options):
        path = out_dir / graph_file(spec.role)
        export_graph(spec, path)
        int8_file = None
        if int8:
            int8_file = int8_graph_file(spec.role)
            quantize_int8(path, out_dir / int8_file)
            if fp16_storage:
                store_initializers_fp16(out_dir / int8_file)  # the embedding Gather stays float
        if fp16_storage:
            store_initializers_fp16(path)
        graphs[spec.role] = {"file": path.name, "int8_file": int8_file, **describe_io(path)}
    extra = model.artifact_fields() if isinstance(model, Embedder) else None
    model_config = cast(TransformerConfig, model.config)  # every exportable model has one
    config = build_config(kind, model_config, graphs, "float16" if fp16_storage else "float32", served_name, extra)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(tokenizer_path, out_dir / "tokenizer.json")
    if card_dir is not None:
        for name in ("card.json", "card.md", "learning_curve.png"):
            if (card_dir / name).exists():
                shutil.copyfile(card_dir / name, out_dir / name)
    if not (out_dir / "card.json").exists():
        untrained = {"model": served_name, "metrics": {}, "note": "untrained", "config": model_config.to_dict()}
        (out_dir / "card.json").write_text(json.dumps(untrained, indent=2) + "\n")
    record_golden(out_dir)
    return config
