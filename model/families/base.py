"""What every Hugging Face family module uses: the checkpoint's tensors with read tracking, the Linear and
LayerNorm copy helpers, option checks, the activation names and the LM head check (the family records
themselves are model/families/shapes.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

import torch
from tokenizers import Tokenizer
from torch import Tensor

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "swish": "silu", "silu": "silu"}
# Buffers some checkpoints carry that are not weights (position ids, GPT-2's causal mask).
NON_WEIGHTS = re.compile(r"(^|\.)(position_ids|token_type_ids|attn\.bias|attn\.masked_bias)$")
Value = TypeVar("Value")


class CheckpointError(ValueError):
    """The folder cannot be imported; the message says what was found and what is missing."""


class Tensors:
    """The checkpoint's tensors; every read is recorded so that unread ones can be reported."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors, self.read = tensors, set[str]()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise CheckpointError(f"the checkpoint lacks tensor {name!r}")
        self.read.add(name)
        return self.tensors[name]

    def take_alias(self, name: str, same_as: Tensor) -> None:
        """A tied copy (e.g. an LM head saved beside its embedding): read it if present, and it must match."""
        if name in self.tensors and not torch.equal(self.take(name), same_as):
            raise CheckpointError(f"{name!r} should be tied to the embedding but differs from it")

    def discard(self, prefix: str) -> list[str]:
        """Mark the tensors under ``prefix`` as read without using them (a part our model replaces)."""
        names = [k for k in self.tensors if k.startswith(prefix)]
        self.read.update(names)
        return names

    def unread(self) -> list[str]:
        return sorted(k for k in self.tensors if k not in self.read and not NON_WEIGHTS.search(k))


def linear(out: dict[str, Tensor], ours: str, src: Tensors, theirs: str, transpose: bool = False) -> None:
    """nn.Linear weight + bias; ``transpose`` for GPT-2's Conv1D ([in, out] weights)."""
    weight = src.take(f"{theirs}.weight")
    out[f"{ours}.weight"] = weight.T.contiguous() if transpose else weight
    if src.has(f"{theirs}.bias"):
        out[f"{ours}.bias"] = src.take(f"{theirs}.bias")


def norm(out: dict[str, Tensor], ours: str, src: Tensors, theirs: str) -> None:
    out[f"{ours}.weight"], out[f"{ours}.bias"] = src.take(f"{theirs}.weight"), src.take(f"{theirs}.bias")


def require(hf: dict[str, Any], key: str, expected: Any, family: str) -> None:
    """An HF option our layers do not cover must be at the value we do cover."""
    if key in hf and hf[key] != expected:
        raise CheckpointError(f"{family}: {key}={hf[key]!r} is not supported (only {expected!r})")


def activation(hf: dict[str, Any], key: str, family: str, default: str = "gelu") -> str:
    """The config's activation under ``key``; ``default``: what the family's transformers config assumes."""
    name = hf.get(key, default)
    if name not in ACTIVATIONS:
        raise CheckpointError(f"{family}: activation {name!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def strip_prefix(tensors: dict[str, Value], prefix: str) -> dict[str, Value]:
    """Task models nest the base model (``bert.``, ``transformer.``, ``model.``); base models do not."""
    return {k.removeprefix(prefix): v for k, v in tensors.items()}


def token_id(tokenizer: Tokenizer, token: str, folder: Path) -> int:
    found = tokenizer.token_to_id(token)
    if found is None:
        raise CheckpointError(f"{folder}: the tokenizer has no {token!r} token")
    return int(found)


def special_token_names(folder: Path) -> dict[str, str]:
    """``special_tokens_map.json`` / ``tokenizer_config.json`` names (e.g. cls -> [CLS]), where given."""
    names: dict[str, str] = {}
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / file
        if path.is_file():
            for key, value in json.loads(path.read_text()).items():
                if key.endswith("_token") and value:
                    names[key[: -len("_token")]] = value["content"] if isinstance(value, dict) else str(value)
    return names


def named_special_tokens(folder: Path, tokenizer: Tokenizer, defaults: dict[str, str]) -> dict[str, int]:
    """Ids of the roles in ``defaults`` (role -> token text), the folder's own names taking precedence."""
    names = defaults | {k: v for k, v in special_token_names(folder).items() if k in defaults}
    return {role: token_id(tokenizer, name, folder) for role, name in names.items()}


def output_head(out: dict[str, Tensor], tied: bool, lm_head: Tensor | None, embedding: str, family: str) -> None:
    """The LM head: a tied one saved beside the embedding must equal it; an untied one must be saved."""
    if tied:
        if lm_head is not None and not torch.equal(lm_head, out[embedding]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to {embedding} but differs from it")
        return
    if lm_head is None:
        raise CheckpointError(f"{family}: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
    out["lm_head.weight"] = lm_head


def config_token_id(folder: Path, hf: dict[str, Any], key: str, fallback: int | None = None) -> int:
    """A special token's id from config.json (``fallback`` where it has none); a CheckpointError if neither."""
    value = hf.get(key, fallback)
    if not isinstance(value, int):
        raise CheckpointError(f"{folder}/config.json: {key} is required")
    return value


def fairseq_layers(out: dict[str, Tensor], src: Tensors, n_encoder_layers: int, n_decoder_layers: int) -> None:
    """The encoder and decoder layers of the fairseq-style translators (Marian, BART, M2M100): self-attention,
    the decoder's cross-attention (``encoder_attn``), fc1/fc2, a LayerNorm after each, one name scheme."""
    own = ("self_attn", "self_attn", "ln_self", "self_attn_layer_norm")  # ours, theirs, our norm, their norm
    cross = ("cross_attn", "encoder_attn", "ln_cross", "encoder_attn_layer_norm")
    for side, ours_side, count, attentions in (("encoder", "encoder_layers", n_encoder_layers, [own]),
                                               ("decoder", "decoder_layers", n_decoder_layers, [own, cross])):
        for i in range(count):
            ours, theirs = f"{ours_side}.{i}", f"{side}.layers.{i}"
            for our_attn, their_attn, our_norm, their_norm in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    linear(out, f"{ours}.{our_attn}.{proj}", src, f"{theirs}.{their_attn}.{proj}")
                norm(out, f"{ours}.{our_norm}", src, f"{theirs}.{their_norm}")
            linear(out, f"{ours}.ff.fc1", src, f"{theirs}.fc1")
            linear(out, f"{ours}.ff.fc2", src, f"{theirs}.fc2")
            norm(out, f"{ours}.ln_ff", src, f"{theirs}.final_layer_norm")
