"""Imported model vs ``transformers`` itself: the same padded batch through both, logits compared.

Used by scripts/import_checkpoint.py (the parity figures in the card) and by tests/model/test_hf_import.py and
tests/model/test_hf_encoders.py.
Needs ``transformers`` (the ``import`` extra); the server never imports this module.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from model.export.graphs import round_weights_to_fp16
from model.families import DECODER_FAMILIES, ENCODER_FAMILIES, SEQ2SEQ_FAMILIES
from model.network.classifier import Classifier
from model.network.embedder import Embedder, pool

if TYPE_CHECKING:
    from transformers import PreTrainedModel

M = TypeVar("M", bound=nn.Module)

SAMPLE_TEXTS = [
    "A wonderful, moving film with brilliant performances.",
    "Dull.",
    "The plot is thin, but the acting saves it in the end, mostly.",
]


def load_hf_model(folder: Path, family: str, has_head: bool = True) -> PreTrainedModel:
    import transformers

    if family in ENCODER_FAMILIES:
        name = ENCODER_FAMILIES[family].reference_classes[1 if has_head else 0]
    elif family in DECODER_FAMILIES:
        name = DECODER_FAMILIES[family].reference_class
    else:
        name = SEQ2SEQ_FAMILIES[family].reference_class
    model: PreTrainedModel = getattr(transformers, name).from_pretrained(str(folder), attn_implementation="eager")
    model.eval()
    return model


def fp16_rounded(model: M) -> M:
    """A copy with weights rounded as the exporter stores them, so fp16 storage is not counted as a mismatch."""
    rounded = copy.deepcopy(model)
    round_weights_to_fp16(rounded)
    return rounded


def padded(tokenizer: Tokenizer, texts: list[str], pad: int, left: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """ids, token types and mask [B, S]; right padding unless ``left`` (decoder-only prompts)."""
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = torch.full((len(texts), width), pad, dtype=torch.long)
    types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        cols = slice(width - n, width) if left else slice(0, n)
        ids[i, cols], types[i, cols], mask[i, cols] = torch.tensor(e.ids), torch.tensor(e.type_ids), 1
    return ids, types, mask


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_outputs(artifact: Path, role: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    config = json.loads((artifact / "config.json").read_text())
    sess = session(artifact / config["graphs"][role]["file"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def empty_cache(config: dict[str, Any], batch: int, prefix: str) -> dict[str, np.ndarray]:
    dims = config["dims"]
    layers = dims.get("n_decoder_layers", dims.get("n_layers"))
    shape = (batch, dims.get("n_kv_heads", dims["n_heads"]), 0, dims["d_head"])
    return {f"{prefix}.{i}.{kv}": np.zeros(shape, np.float32) for i in range(layers) for kv in ("key", "value")}


def reference_inputs(family: str, tokenizer: Tokenizer, specials: dict[str, int], texts: list[str]) -> dict[str, Tensor]:
    """One padded batch for the family: classifier/encoder inputs, a left-padded prompt batch, or
    source + a teacher-forced target prefix."""
    if family in ENCODER_FAMILIES:
        ids, types, mask = padded(tokenizer, texts, specials["pad"])
        with_types = {"token_type_ids": types} if ENCODER_FAMILIES[family].token_type_input else {}
        return {"input_ids": ids, **with_types, "attention_mask": mask}
    if family in DECODER_FAMILIES:
        ids, _, mask = padded(tokenizer, texts, specials["pad"], left=True)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}
    ids, _, mask = padded(tokenizer, texts, specials["pad"])
    target = torch.cat([torch.full((len(texts), 1), specials["bos"]), ids[:, :4]], dim=1)  # bos + a few tokens
    target_mask = torch.ones_like(target)
    target_mask[-1, 3:] = 0  # one target row right-padded
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": target, "decoder_attention_mask": target_mask}


@torch.no_grad()
def hf_logits(model: nn.Module, family: str, inputs: dict[str, Tensor]) -> Tensor:
    outputs = model(**inputs)  # a transformers ModelOutput
    if family in ENCODER_FAMILIES and not hasattr(model, "classifier"):
        hidden: Tensor = outputs.last_hidden_state  # a headless encoder: compare its hidden states
        return hidden
    logits: Tensor = outputs.logits
    return logits


@torch.no_grad()
def ours_logits(model: nn.Module, family: str, inputs: dict[str, Tensor], headless: bool = False) -> Tensor:
    """Our model's logits for ``reference_inputs``; ``headless`` (or an embedder): the encoder's hidden states."""
    if family in ENCODER_FAMILIES:
        encoder = cast(Classifier, model.encoder if isinstance(model, Embedder) else model)
        args = (inputs["input_ids"], inputs.get("token_type_ids"), inputs["attention_mask"])
        encoded: Tensor = encoder.encode(*args)[0] if headless or isinstance(model, Embedder) else encoder(*args)[0]
        return encoded
    if family in DECODER_FAMILIES:
        generated: Tensor = model(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"])[0]
        return generated
    target = inputs["decoder_input_ids"]
    translated: Tensor = model(inputs["input_ids"], inputs["attention_mask"], target, inputs["decoder_attention_mask"])
    return translated


def onnx_logits(artifact: Path, family: str, inputs: dict[str, Tensor]) -> np.ndarray:
    config = json.loads((artifact / "config.json").read_text())
    np_inputs = {k: v.numpy() for k, v in inputs.items()}
    if family in ENCODER_FAMILIES:
        # The graph's own inputs: BERT's token types, zeros where the reference had none to take.
        names = [i["name"] for i in config["graphs"]["encoder"]["inputs"]]
        feeds = {k: np_inputs.get(k, np.zeros_like(np_inputs["input_ids"])) for k in names}
        outputs = onnx_outputs(artifact, "encoder", feeds)
        return outputs["logits"] if "logits" in outputs else outputs["embeddings"]
    if family in DECODER_FAMILIES:
        feeds = {k: np_inputs[k] for k in ("input_ids", "attention_mask", "position_ids")}
        feeds |= empty_cache(config, len(np_inputs["input_ids"]), "past_key_values")
        return onnx_outputs(artifact, "decoder", feeds)["logits"]
    encoded = onnx_outputs(artifact, "encoder", {k: np_inputs[k] for k in ("input_ids", "attention_mask")})
    target = np_inputs["decoder_input_ids"]
    feeds = {
        "input_ids": target,
        "attention_mask": np_inputs["decoder_attention_mask"],
        "position_ids": np.tile(np.arange(target.shape[1]), (len(target), 1)),
        "encoder_attention_mask": np_inputs["attention_mask"],
        **{k: v for k, v in encoded.items() if k.startswith("cross.")},
        **empty_cache(config, len(target), "past_key_values"),
    }
    return onnx_outputs(artifact, "decoder", feeds)["logits"]


@torch.no_grad()
def hf_embeddings(model: nn.Module, inputs: dict[str, Tensor], pooling: str) -> Tensor:
    """A headless reference's last hidden states pooled as sentence-transformers pools them."""
    return pool(model(**inputs).last_hidden_state, inputs["attention_mask"], pooling)


def real_positions(family: str, inputs: dict[str, Tensor]) -> Tensor | None:
    """Boolean [B, S] of the positions whose [B, S, ...] outputs count (padding is not compared)."""
    if family in ENCODER_FAMILIES or family in DECODER_FAMILIES:
        return inputs["attention_mask"].bool()
    if family in SEQ2SEQ_FAMILIES:
        return inputs["decoder_attention_mask"].bool()
    return None


def max_abs_diff(a: Tensor | np.ndarray, b: Tensor | np.ndarray, keep: Tensor | None) -> float:
    a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
    if keep is not None and a.dim() == 3:
        a, b = a[keep], b[keep]
    return float((a - b).abs().max())
