"""Hugging Face-format checkpoints -> our model classes (BERT-family encoders, GPT-2, Marian, BART).

A checkpoint folder holds ``config.json``, the weights (``model.safetensors`` or ``pytorch_model.bin``,
read with ``weights_only=True``) and tokenizer files. Each family maps the HF config onto our config's
options (model/config.py) and every HF tensor onto one of our parameters; the mapping is checked both
ways: a checkpoint tensor nobody reads, or one of our parameters nobody fills, is an error that names
them. torch and safetensors only: ``transformers`` is needed just for slow tokenizers (model/hf_tokenizer.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from model.classifier import Classifier
from model.config import ClassifierConfig, GeneratorConfig, TransformerConfig, TranslatorConfig
from model.generator import Generator
from model.translator import Translator
from service.contract.kinds import FAMILIES

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "swish": "silu", "silu": "silu"}
# Buffers some checkpoints carry that are not weights (position ids, GPT-2's causal mask).
NON_WEIGHTS = re.compile(r"(^|\.)(position_ids|token_type_ids|attn\.bias|attn\.masked_bias)$")


class CheckpointError(ValueError):
    """The folder cannot be imported; the message says what was found and what is missing."""


@dataclass
class Imported:
    """An imported model and what the card should say about it."""

    kind: str  # "translator" | "generator" | "classifier"
    family: str  # "bert" | "gpt2" | "marian" | "bart"
    model: nn.Module
    hf_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # e.g. a head initialized fresh


# --- reading the folder ---------------------------------------------------------------------------------


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json (found: {sorted(p.name for p in folder.iterdir())})")
    return json.loads(path.read_text())


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors, as float32 (pytorch_model.bin is unpickled with weights_only=True)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(
            f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)} "
            f"(found: {sorted(p.name for p in folder.iterdir())})"
        )
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


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
        if name in self.tensors:
            if not torch.equal(self.take(name), same_as):
                raise CheckpointError(f"{name!r} should be tied to the embedding but differs from it")

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


def activation(hf: dict[str, Any], key: str, family: str) -> str:
    name = hf.get(key, "gelu")
    if name not in ACTIVATIONS:
        raise CheckpointError(f"{family}: activation {name!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def strip_prefix(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Task models nest the base model (``bert.``, ``transformer.``, ``model.``); base models do not."""
    return {k.removeprefix(prefix): v for k, v in tensors.items()}


# --- BERT-architecture encoders (BERT, MiniLM) -> Classifier ------------------------------------------------


def bert_config(hf: dict[str, Any], specials: dict[str, int], labels: list[str]) -> ClassifierConfig:
    require(hf, "position_embedding_type", "absolute", "bert")
    require(hf, "is_decoder", False, "bert")
    return ClassifierConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], n_layers=hf["num_hidden_layers"], dropout=hf.get("hidden_dropout_prob", 0.1),
        max_positions=hf["max_position_embeddings"], activation=activation(hf, "hidden_act", "bert"),
        learned_positions=True, type_vocab_size=hf.get("type_vocab_size", 2), labels=labels,
        special_tokens=specials, norm_position="post", scale_embeddings=False, embedding_layer_norm=True,
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), pooler=True,
    )


def bert_weights(src: Tensors, n_layers: int, notes: list[str], fresh: list[str]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    out["tok_emb.weight"] = src.take("embeddings.word_embeddings.weight")
    out["seg_emb.weight"] = src.take("embeddings.token_type_embeddings.weight")
    out["pos.table.weight"] = src.take("embeddings.position_embeddings.weight")
    norm(out, "ln_emb", src, "embeddings.LayerNorm")
    for i in range(n_layers):
        ours, theirs = f"layers.{i}", f"encoder.layer.{i}"
        for proj, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            linear(out, f"{ours}.self_attn.{proj}", src, f"{theirs}.attention.self.{name}")
        linear(out, f"{ours}.self_attn.out_proj", src, f"{theirs}.attention.output.dense")
        norm(out, f"{ours}.ln_self", src, f"{theirs}.attention.output.LayerNorm")
        linear(out, f"{ours}.ff.fc1", src, f"{theirs}.intermediate.dense")
        linear(out, f"{ours}.ff.fc2", src, f"{theirs}.output.dense")
        norm(out, f"{ours}.ln_ff", src, f"{theirs}.output.LayerNorm")
    if src.has("pooler.dense.weight"):
        linear(out, "pooler.0", src, "pooler.dense")
    else:
        notes.append("the checkpoint has no pooler: pooler initialized at random")
        fresh.append("pooler.")
    if src.has("classifier.weight"):
        linear(out, "cls_head", src, "classifier")
    else:
        notes.append("the checkpoint has no classification head: head initialized at random (fine-tune it)")
        fresh.append("cls_head.")
    return out


# --- GPT-2 -> Generator ------------------------------------------------------------------------------------


def gpt2_config(hf: dict[str, Any], specials: dict[str, int]) -> GeneratorConfig:
    for key, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                       ("add_cross_attention", False)):
        require(hf, key, value, "gpt2")
    d = hf["n_embd"]
    return GeneratorConfig(
        vocab_size=hf["vocab_size"], d_model=d, n_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * d,
        n_layers=hf["n_layer"], dropout=hf.get("resid_pdrop", 0.1), max_positions=hf["n_positions"],
        activation=activation(hf, "activation_function", "gpt2"), learned_positions=True, special_tokens=specials,
        norm_position="pre", scale_embeddings=False, layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_output=hf.get("tie_word_embeddings", True),
    )


def gpt2_weights(src: Tensors, c: GeneratorConfig, lm_head: Tensor | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"tok_emb.weight": src.take("wte.weight"), "pos.table.weight": src.take("wpe.weight")}
    d = c.d_model
    for i in range(c.n_layers):
        ours, theirs = f"blocks.{i}", f"h.{i}"
        norm(out, f"{ours}.ln_self", src, f"{theirs}.ln_1")
        qkv_w, qkv_b = src.take(f"{theirs}.attn.c_attn.weight"), src.take(f"{theirs}.attn.c_attn.bias")  # [D, 3D]
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            out[f"{ours}.self_attn.{proj}.weight"] = qkv_w[:, j * d : (j + 1) * d].T.contiguous()
            out[f"{ours}.self_attn.{proj}.bias"] = qkv_b[j * d : (j + 1) * d]
        linear(out, f"{ours}.self_attn.out_proj", src, f"{theirs}.attn.c_proj", transpose=True)
        norm(out, f"{ours}.ln_ff", src, f"{theirs}.ln_2")
        linear(out, f"{ours}.ff.fc1", src, f"{theirs}.mlp.c_fc", transpose=True)
        linear(out, f"{ours}.ff.fc2", src, f"{theirs}.mlp.c_proj", transpose=True)
    norm(out, "ln_f", src, "ln_f")
    if not c.tie_output:
        if lm_head is None:
            raise CheckpointError("gpt2: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
        out["lm_head.weight"] = lm_head
    return out


# --- Marian and BART -> Translator ---------------------------------------------------------------------------


def seq2seq_config(hf: dict[str, Any], family: str, specials: dict[str, int]) -> TranslatorConfig:
    for side in ("attention_heads", "ffn_dim"):
        if hf.get(f"encoder_{side}") != hf.get(f"decoder_{side}"):
            raise CheckpointError(f"{family}: encoder_{side} != decoder_{side} is not supported (one set of dims)")
    require(hf, "normalize_before", False, family)
    require(hf, "add_final_layer_norm", False, family)
    require(hf, "share_encoder_decoder_embeddings", True, family)
    marian = family == "marian"
    return TranslatorConfig(
        vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"], n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), max_positions=hf["max_position_embeddings"],
        activation=activation(hf, "activation_function", family), special_tokens=specials, norm_position="post",
        learned_positions=not marian, sinusoid_layout="split" if marian else "interleaved",
        position_offset=0 if marian else 2, separate_decoder_positions=not marian,
        scale_embeddings=bool(hf.get("scale_embedding", marian)), embedding_layer_norm=not marian,
        tie_output=hf.get("tie_word_embeddings", True), final_logits_bias=True, layer_norm_eps=1e-5,
    )


def seq2seq_weights(src: Tensors, c: TranslatorConfig, family: str, lm_head: Tensor | None,
                    final_logits_bias: Tensor | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"embed.weight": src.take("shared.weight")}
    for side in ("encoder", "decoder"):
        src.take_alias(f"{side}.embed_tokens.weight", out["embed.weight"])
    if family == "bart":
        out["pos.table.weight"] = src.take("encoder.embed_positions.weight")
        out["pos_dec.table.weight"] = src.take("decoder.embed_positions.weight")
        norm(out, "ln_emb_enc", src, "encoder.layernorm_embedding")
        norm(out, "ln_emb_dec", src, "decoder.layernorm_embedding")
    else:  # Marian's sinusoids are computed, not learned; a saved copy must be the table we compute
        from model.layers import sinusoidal_table

        table = sinusoidal_table(c.max_positions, c.d_model, "split")
        for side in ("encoder", "decoder"):
            name = f"{side}.embed_positions.weight"
            if src.has(name) and not torch.allclose(src.take(name), table, atol=1e-5):
                raise CheckpointError(f"marian: {name} is not the sinusoidal table Marian computes")
    for side, ours_side, count in (("encoder", "encoder_layers", c.n_encoder_layers),
                                   ("decoder", "decoder_layers", c.n_decoder_layers)):
        for i in range(count):
            ours, theirs = f"{ours_side}.{i}", f"{side}.layers.{i}"
            attentions = [("self_attn", "self_attn", "ln_self", "self_attn_layer_norm")]
            if side == "decoder":
                attentions.append(("cross_attn", "encoder_attn", "ln_cross", "encoder_attn_layer_norm"))
            for our_attn, their_attn, our_norm, their_norm in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    linear(out, f"{ours}.{our_attn}.{proj}", src, f"{theirs}.{their_attn}.{proj}")
                norm(out, f"{ours}.{our_norm}", src, f"{theirs}.{their_norm}")
            linear(out, f"{ours}.ff.fc1", src, f"{theirs}.fc1")
            linear(out, f"{ours}.ff.fc2", src, f"{theirs}.fc2")
            norm(out, f"{ours}.ln_ff", src, f"{theirs}.final_layer_norm")
    if final_logits_bias is None:
        raise CheckpointError(f"{family}: the checkpoint lacks final_logits_bias")
    out["lm_head.bias"] = final_logits_bias.reshape(-1)
    if not c.tie_output:
        if lm_head is None:
            raise CheckpointError(f"{family}: tie_word_embeddings is false but the checkpoint has no lm_head.weight")
        out["lm_head.weight"] = lm_head
    return out


# --- one entry point --------------------------------------------------------------------------------------

# Our parameters a family's checkpoint never fills: the classifier's pretraining heads are not in the
# exported graph (and are kept at their initialization).
PRETRAINING_ONLY = {"classifier": ("mlm_transform.", "mlm_bias", "nsp_head.")}


def detect_family(hf: dict[str, Any]) -> str:
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        architectures = hf.get("architectures")
        raise CheckpointError(
            f"unsupported architecture: model_type={model_type!r}, architectures={architectures!r}; "
            f"supported model types: {', '.join(FAMILIES)}"
        )
    return str(model_type)


def load_checked(model: nn.Module, weights: dict[str, Tensor], kind: str, fresh: tuple[str, ...] = ()) -> None:
    """Load ``weights``; every parameter of ``model`` must be filled, except tied copies, the
    pretraining-only heads and the ``fresh`` prefixes (parts the checkpoint does not have, said in the notes)."""
    state = model.state_dict()
    skip = PRETRAINING_ONLY.get(kind, ()) + fresh
    tied = {"lm_head.weight"} if getattr(model.config, "tie_output", False) else set()
    missing = sorted(k for k in state if k not in weights and k not in tied and not k.startswith(skip))
    unknown = sorted(k for k in weights if k not in state)
    if missing or unknown:
        raise CheckpointError(f"the mapping does not cover our model: missing {missing}, unknown {unknown}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise CheckpointError(f"{name}: checkpoint shape {tuple(tensor.shape)} != ours {tuple(state[name].shape)}")
    model.load_state_dict(weights, strict=False)


def import_checkpoint(folder: Path, specials: dict[str, int], labels: list[str] | None = None) -> Imported:
    """Build our model from the checkpoint in ``folder``; ``specials`` come from its tokenizer
    (model/hf_tokenizer.py), ``labels`` name a fresh classification head's classes."""
    hf = read_hf_config(folder)
    family = detect_family(hf)
    kind = FAMILIES[family]
    raw = read_weights(folder)
    notes: list[str] = []
    fresh: list[str] = []

    def bert() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        tensors = strip_prefix(raw, "bert.")
        src = Tensors(tensors)
        names = hf_labels(hf) if src.has("classifier.weight") else (labels or ["negative", "positive"])
        c = bert_config(hf, specials, names)
        model = Classifier(c)
        return c, model, bert_weights(src, c.n_layers, notes, fresh), src

    def gpt2() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        head = raw.get("lm_head.weight")
        tensors = strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, "transformer.")
        src = Tensors(tensors)
        c = gpt2_config(hf, specials)
        out = gpt2_weights(src, c, head)
        if c.tie_output and head is not None and not torch.equal(head, out["tok_emb.weight"]):
            raise CheckpointError("gpt2: lm_head.weight should be tied to wte.weight but differs from it")
        return c, Generator(c), out, src

    def seq2seq() -> tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]:
        head, bias = raw.get("lm_head.weight"), raw.get("final_logits_bias")
        rest = {k: v for k, v in raw.items() if k not in ("lm_head.weight", "final_logits_bias")}
        tensors = strip_prefix(rest, "model.")
        src = Tensors(tensors)
        c = seq2seq_config(hf, family, specials)
        out = seq2seq_weights(src, c, family, head, bias)
        if c.tie_output and head is not None and not torch.equal(head, out["embed.weight"]):
            raise CheckpointError(f"{family}: lm_head.weight should be tied to the shared embedding but differs")
        return c, Translator(c), out, src

    builders: dict[str, Callable[[], tuple[TransformerConfig, nn.Module, dict[str, Tensor], Tensors]]] = {
        "bert": bert, "gpt2": gpt2, "marian": seq2seq, "bart": seq2seq}
    config, model, weights, src = builders[family]()
    if unread := src.unread():
        raise CheckpointError(f"{family}: the checkpoint has tensors the mapping does not use: {unread}")
    load_checked(model, weights, kind, tuple(fresh))
    return Imported(kind, family, model.eval(), hf, notes)


def hf_labels(hf: dict[str, Any]) -> list[str]:
    id2label = hf.get("id2label") or {}
    n = len(id2label) or hf.get("num_labels", 2)
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]
