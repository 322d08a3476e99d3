"""PyTorch -> ONNX: the graphs, config.json and golden outputs the server loads (see artifacts/README.md).

Recipe (../shared/design/ARCHITECTURE.md, section 4): dynamo export at opset 20,
example inputs with batch >= 2 and sequence >= 2 (smaller ones can freeze a
reshape), every length dynamic, the KV cache as graph inputs/outputs, int64 ids.
Weights are stored as fp16 initializers followed by a Cast to fp32 (ORT folds
the Cast at load), which halves the files; the PyTorch weights are rounded the
same way first, so the graph and the reference model compute the same function.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch
from torch import Tensor, nn
from torch.export import Dim

from model.classifier import Classifier
from model.config import ClassifierConfig, GeneratorConfig, TransformerConfig, TranslatorConfig
from model.generator import Generator
from model.int8 import FP16_MIN_ELEMENTS, quantize_int8, store_initializers_fp16
from model.translator import Translator

if TYPE_CHECKING:
    from tokenizers import Tokenizer

OPSET = 20
FORMAT_VERSION = 1


# --- graph wrappers: flat tensors in, flat tensors out, in the contract's order -------------------


def kv_names(prefix: str, n_layers: int) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


def pairs(flat: tuple[Tensor, ...] | list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def flatten(kvs: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
    return [t for kv in kvs for t in kv]


class TranslatorEncoderGraph(nn.Module):
    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory, weights = self.model.encode(input_ids, attention_mask)
        return (*flatten(self.model.cross_kv(memory)), *weights)


class TranslatorDecoderGraph(nn.Module):
    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, encoder_attention_mask: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        n = 2 * self.model.config.n_decoder_layers
        cross, past = pairs(caches[:n]), pairs(caches[n:])
        logits, present, self_w, cross_w = self.model.decode(
            input_ids, attention_mask, position_ids, encoder_attention_mask, cross, past
        )
        return (logits, *flatten(present), *self_w, *cross_w)


class GeneratorGraph(nn.Module):
    def __init__(self, model: Generator) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        logits, present, weights = self.model(input_ids, attention_mask, position_ids, pairs(past))
        return (logits, *flatten(present), *weights)


class ClassifierGraph(nn.Module):
    def __init__(self, model: Classifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        logits, weights = self.model(input_ids, token_type_ids, attention_mask)
        return (logits, *weights)


# --- graph specs: example inputs, names and dynamic axes --------------------------------------------


@dataclass
class GraphSpec:
    """Everything torch.onnx.export needs for one graph."""

    role: str
    module: nn.Module
    example: tuple[Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: tuple[Any, ...]


BATCH, SEQ, PAST, SRC = Dim("batch"), Dim("seq"), Dim("past"), Dim("src")


def _ids(vocab: int, B: int, S: int, generator: torch.Generator) -> Tensor:
    return torch.randint(4, vocab, (B, S), generator=generator)


def translator_specs(model: Translator) -> list[GraphSpec]:
    c, g = model.config, torch.Generator().manual_seed(0)
    B, S, P, Ssrc = 2, 3, 4, 5  # all >= 2 and distinct, so no axis is frozen by coincidence
    src_ids, src_mask = _ids(c.vocab_size, B, Ssrc, g), torch.ones(B, Ssrc, dtype=torch.long)
    src_mask[1, -2:] = 0
    n_dec = c.n_decoder_layers
    cross = [torch.randn(B, c.n_heads, Ssrc, c.d_head, generator=g) for _ in range(2 * n_dec)]
    past = [torch.randn(B, c.n_heads, P, c.d_head, generator=g) for _ in range(2 * n_dec)]
    encoder = GraphSpec(
        role="encoder",
        module=TranslatorEncoderGraph(model),
        example=(src_ids, src_mask),
        input_names=["input_ids", "attention_mask"],
        output_names=kv_names("cross", n_dec) + [f"attentions.{i}" for i in range(c.n_encoder_layers)],
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
        input_names=["input_ids", "attention_mask", "position_ids", "encoder_attention_mask"]
        + kv_names("cross", n_dec)
        + kv_names("past_key_values", n_dec),
        output_names=["logits"]
        + kv_names("present", n_dec)
        + [f"attentions.{i}" for i in range(n_dec)]
        + [f"cross_attentions.{i}" for i in range(n_dec)],
        dynamic_shapes=(
            {0: BATCH, 1: SEQ},
            {0: BATCH, 1: Dim("total")},
            {0: BATCH, 1: SEQ},
            {0: BATCH, 1: SRC},
            tuple([{0: BATCH, 2: SRC}] * (2 * n_dec) + [{0: BATCH, 2: PAST}] * (2 * n_dec)),
        ),
    )
    return [encoder, decoder]


def generator_specs(model: Generator) -> list[GraphSpec]:
    c, g = model.config, torch.Generator().manual_seed(0)
    B, S, P = 2, 3, 4
    past = [torch.randn(B, c.n_heads, P, c.d_head, generator=g) for _ in range(2 * c.n_layers)]
    return [
        GraphSpec(
            role="decoder",
            module=GeneratorGraph(model),
            example=(
                _ids(c.vocab_size, B, S, g),
                torch.ones(B, P + S, dtype=torch.long),
                torch.arange(P, P + S).expand(B, S).contiguous(),
                *past,
            ),
            input_names=["input_ids", "attention_mask", "position_ids"] + kv_names("past_key_values", c.n_layers),
            output_names=["logits"] + kv_names("present", c.n_layers) + [f"attentions.{i}" for i in range(c.n_layers)],
            dynamic_shapes=(
                {0: BATCH, 1: SEQ},
                {0: BATCH, 1: Dim("total")},
                {0: BATCH, 1: SEQ},
                tuple([{0: BATCH, 2: PAST}] * (2 * c.n_layers)),
            ),
        )
    ]


def classifier_specs(model: Classifier) -> list[GraphSpec]:
    c, g = model.config, torch.Generator().manual_seed(0)
    B, S = 2, 5
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, -2:] = 0
    types = torch.zeros(B, S, dtype=torch.long)
    types[:, 3:] = 1
    return [
        GraphSpec(
            role="encoder",
            module=ClassifierGraph(model),
            example=(_ids(c.vocab_size, B, S, g), types, mask),
            input_names=["input_ids", "token_type_ids", "attention_mask"],
            output_names=["logits"] + [f"attentions.{i}" for i in range(c.n_layers)],
            dynamic_shapes=({0: BATCH, 1: SEQ}, {0: BATCH, 1: SEQ}, {0: BATCH, 1: SEQ}),
        )
    ]


MODEL_CLASSES: dict[str, type[nn.Module]] = {"translator": Translator, "generator": Generator, "classifier": Classifier}
SPECS = {"translator": translator_specs, "generator": generator_specs, "classifier": classifier_specs}
TASKS = {
    "translator": ("translation", "encoder-decoder"),
    "generator": ("generation", "decoder-only"),
    "classifier": ("classification", "encoder"),
}


# --- ONNX passes ------------------------------------------------------------------------------------


def round_weights_to_fp16(model: nn.Module) -> None:
    """Round every large float parameter and buffer (the sinusoidal table) to fp16 precision, in place,
    so the PyTorch model computes exactly what the fp16-stored graph does."""
    with torch.no_grad():
        for p in [*model.parameters(), *model.buffers()]:
            if p.dtype == torch.float32 and p.numel() >= FP16_MIN_ELEMENTS:
                p.copy_(p.half().float())


def describe_io(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Input/output names, dtypes and (symbolic) shapes, read back from the saved graph."""
    m = onnx.load(str(path), load_external_data=False)

    def values(vis: Any) -> list[dict[str, Any]]:
        out = []
        for vi in vis:
            t = vi.type.tensor_type
            dims = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
            out.append({"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": dims})
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
        output_names=spec.output_names,
        dynamic_shapes=spec.dynamic_shapes,
        verbose=False,
    )


# --- the artifact folder ------------------------------------------------------------------------------


def build_config(
    kind: str, config: TransformerConfig, graphs: dict[str, dict[str, Any]], weights_storage: str, name: str | None = None
) -> dict[str, Any]:
    import onnxruntime

    task, architecture = TASKS[kind]
    dims: dict[str, int] = {"d_model": config.d_model, "n_heads": config.n_heads, "d_head": config.d_head, "d_ff": config.d_ff}
    if isinstance(config, TranslatorConfig):
        dims |= {"n_encoder_layers": config.n_encoder_layers, "n_decoder_layers": config.n_decoder_layers}
    else:
        dims["n_layers"] = config.n_layers  # type: ignore[attr-defined]
    out: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": name or kind,
        "task": task,
        "architecture": architecture,
        "dims": dims,
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
    if isinstance(config, ClassifierConfig):
        out["labels"] = list(config.labels)
    return out


def export_model(
    kind: str,
    model: nn.Module,
    tokenizer_path: Path,
    out_dir: Path,
    card_dir: Path | None = None,
    fp16_storage: bool = True,
    int8: bool = True,
    name: str | None = None,
) -> dict[str, Any]:
    """Export ``model`` to ``out_dir`` (graphs, config.json, tokenizer.json, card, golden.json).

    ``name`` is the served model name (default: ``kind``); serve it from a folder of that name."""
    from model.golden import record_golden

    served_name = name or kind
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    if fp16_storage:
        round_weights_to_fp16(model)
    graphs: dict[str, dict[str, Any]] = {}
    for spec in SPECS[kind](model):  # type: ignore[operator]
        path = out_dir / f"{spec.role}.onnx"
        export_graph(spec, path)
        int8_file = None
        if int8:
            int8_file = f"{spec.role}.int8.onnx"
            quantize_int8(path, out_dir / int8_file)
            if fp16_storage:
                store_initializers_fp16(out_dir / int8_file)  # the embedding Gather stays float
        if fp16_storage:
            store_initializers_fp16(path)
        graphs[spec.role] = {"file": path.name, "int8_file": int8_file, **describe_io(path)}
    config = build_config(kind, model.config, graphs, "float16" if fp16_storage else "float32", served_name)  # type: ignore[arg-type]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(tokenizer_path, out_dir / "tokenizer.json")
    if card_dir is not None:
        for name in ("card.json", "card.md", "learning_curve.png"):
            if (card_dir / name).exists():
                shutil.copyfile(card_dir / name, out_dir / name)
    if not (out_dir / "card.json").exists():
        untrained = {"model": served_name, "metrics": {}, "note": "untrained", "config": model.config.to_dict()}  # type: ignore[operator]
        (out_dir / "card.json").write_text(json.dumps(untrained, indent=2) + "\n")
    record_golden(out_dir)
    return config


# --- tiny artifacts for tests -------------------------------------------------------------------------

TINY_CORPUS = [
    "In the beginning God created the heavens and the earth.",
    "Au commencement, Dieu créa les cieux et la terre.",
    "The movie was wonderful, a delight from start to finish.",
    "Le film était très ennuyeux ; où est l'élève ? Déjà à la crèche, naïf garçon « bien sûr ».",
    "A dull, tedious and predictable story with no heart.",
    "Fellow citizens, the state of the union is strong. Café, piñata, 東京, 🙂!",
]


def tiny_config(kind: str, vocab_size: int, special_tokens: dict[str, int]) -> TransformerConfig:
    common = dict(vocab_size=vocab_size, d_model=32, n_heads=2, d_ff=64, max_positions=128, special_tokens=special_tokens)
    if kind == "translator":
        return TranslatorConfig(**common, n_encoder_layers=2, n_decoder_layers=2)
    if kind == "generator":
        return GeneratorConfig(**common, n_layers=2)
    return ClassifierConfig(**common, n_layers=2)


def build_tiny_model(kind: str) -> tuple[nn.Module, "Tokenizer"]:
    """A tiny randomly initialized model and its tokenizer; deterministic (seed 0)."""
    from model import tokenization

    torch.manual_seed(0)
    tokenizer = tokenization.TRAINERS[kind](TINY_CORPUS * 4, 300)
    config = tiny_config(kind, tokenizer.get_vocab_size(), tokenization.SPECIAL_TOKENS[kind])
    return MODEL_CLASSES[kind](config), tokenizer  # type: ignore[call-arg]


def export_tiny_artifacts(out_dir: Path, kinds: tuple[str, ...] = ("translator", "generator", "classifier")) -> None:
    """Tiny models with real (tiny) tokenizers in ``out_dir/<kind>/``, for fast service and export tests.

    The PyTorch reference of each is ``build_tiny_model(kind)`` with ``round_weights_to_fp16`` applied.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        model, tokenizer = build_tiny_model(kind)
        tokenizer_path = out_dir / f"{kind}.tokenizer.json"
        tokenizer.save(str(tokenizer_path))
        export_model(kind, model, tokenizer_path, out_dir / kind)
        tokenizer_path.unlink()
