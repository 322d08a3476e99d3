"""The three shapes a Hugging Face family comes in, each a record type the family modules fill in: a BERT-like
encoder (our classifier, or an embedder without a trained head), a decoder-only LM (our generator) and an
encoder-decoder (our translator).

A shape carries what differs between them, so the importer (model/importing/hf_import.py) and the parity check
(model/importing/hf_parity.py) call the family and never ask which shape it is: the network the weights fill,
the transformers class the reference is loaded with, and the padded batch both sides are fed and compared on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from contract.names import IN_PLACE_AXIS
from model.families.base import CheckpointError, Tensors, strip_prefix
from model.families.dims import ConfigDims
from model.importing.generation_config import apply_generation_config, apply_seq2seq_generation_config
from model.kinds import model_kind
from model.network.classifier import Classifier
from model.network.config import ClassifierConfig, GeneratorConfig, TranslatorConfig
from model.network.embedder import Embedder, EmbeddingOptions
from model.network.generator import Generator
from model.network.translator import Translator

# Runs one graph of an exported artifact: (role, feeds) -> outputs by name.
GraphRunner = Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]
SpecialTokens = Callable[[Path, dict[str, Any], Tokenizer], dict[str, int]]


@dataclass
class Imported:
    """An imported model and what the card should say about it."""

    kind: str  # "translator" | "generator" | "classifier" | "embedder"
    family: str  # an HF model_type: a family of model/families
    model: nn.Module
    hf_config: dict[str, Any]
    config: dict[str, Any]  # what its card and config.json record (an embedder's has no labels: no head)
    notes: list[str] = field(default_factory=list)  # e.g. a head initialized fresh
    headless: bool = False  # an embedder, or a classifier whose head is random: parity compares hidden states
    chat: bool = False  # a generator: the checkpoint's chat template, if it has one, is served with it


@dataclass(frozen=True)
class Checkpoint:
    """What the importer read from a checkpoint folder, and what the caller asked for."""

    folder: Path
    hf: dict[str, Any]  # config.json
    tensors: dict[str, Tensor]  # float32
    specials: dict[str, int]  # from its tokenizer (model/importing/hf_tokenizer.py)
    labels: list[str] | None = None  # an encoder without a trained head: the classes of a random one
    embedding: EmbeddingOptions | None = None  # an encoder from a sentence-transformers folder: its pooling
    languages: dict[str, int] | None = None  # a multilingual translator's language codes


def load_checked(model: nn.Module, weights: dict[str, Tensor], kind: str, fresh: tuple[str, ...] = ()) -> None:
    """Load ``weights``; every parameter of ``model`` must be filled, except tied copies, the
    pretraining-only heads and the ``fresh`` prefixes (parts the checkpoint does not have, said in the notes)."""
    state = model.state_dict()
    skip = model_kind(kind).pretraining_only + fresh  # those heads never reach the exported graph
    tied = {"lm_head.weight"} if getattr(model.config, "tie_output", False) else set()
    missing = sorted(k for k in state if k not in weights and k not in tied and not k.startswith(skip))
    unknown = sorted(k for k in weights if k not in state)
    if missing or unknown:
        raise CheckpointError(f"the mapping does not cover our model: missing {missing}, unknown {unknown}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise CheckpointError(f"{name}: checkpoint shape {tuple(tensor.shape)} != ours {tuple(state[name].shape)}")
    model.load_state_dict(weights, strict=False)


def check_all_read(name: str, src: Tensors) -> None:
    if unread := src.unread():
        raise CheckpointError(f"{name}: the checkpoint has tensors the mapping does not use: {unread}")


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


def empty_cache(config: dict[str, Any], batch: int, prefix: str, length: int = 0) -> dict[str, np.ndarray]:
    """An artifact decoder's past key/value inputs, zero positions long (or zeros of `length` positions: the
    buffers of a graph that writes its cache in place)."""
    dims = config["dims"]
    layers = dims.get("n_decoder_layers", dims.get("n_layers"))
    shape = (batch, dims.get("n_kv_heads", dims["n_heads"]), length, dims["d_head"])
    return {f"{prefix}.{i}.{kv}": np.zeros(shape, np.float32) for i in range(layers) for kv in ("key", "value")}


def writes_cache_in_place(config: dict[str, Any]) -> bool:
    """Whether config.json's decoder graph takes cache buffers it writes into (model/network/in_place.py)."""
    inputs = config["graphs"].get("decoder", {}).get("inputs", [])
    return any(IN_PLACE_AXIS in spec["shape"] for spec in inputs)


def numpy_inputs(inputs: dict[str, Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in inputs.items()}


@dataclass(frozen=True)
class EncoderFamily:
    """A BERT-like encoder family: everything the importer, exporter and parity check need to know of it."""

    name: str  # the HF config.json model_type
    prefix: str  # the base model's prefix inside a task model's weights (``bert.``)
    config: Callable[[dict[str, Any], dict[str, int], list[str]], ClassifierConfig]  # hf, specials, labels
    encoder_weights: Callable[[Tensors, ClassifierConfig], dict[str, Tensor]]
    head_marker: str  # a tensor only a trained sequence-classification head has
    head_weights: Callable[[Tensors], dict[str, Tensor]]  # the trained head (pooler/dense + classifier)
    spare_weights: Callable[[Tensors], dict[str, Tensor]]  # what a base checkpoint has beyond the encoder
    special_tokens: SpecialTokens
    reference_classes: tuple[str, str]  # transformers classes: (base model, sequence classification)
    token_type_input: bool  # the reference model takes token_type_ids (BERT); the others read segment 0 or none
    dims: ConfigDims  # where config.json keeps the sizes, checked against the weights before the model is built
    slow_tokenizer: Callable[[Path], Tokenizer] | None = None  # a converter of its own (else transformers')

    def reference_class(self, has_head: bool) -> str:
        return self.reference_classes[1 if has_head else 0]

    def languages(self, tokenizer: Tokenizer) -> dict[str, int]:
        return {}

    def import_model(self, checkpoint: Checkpoint) -> Imported:
        """A classifier (its trained head, or a random one named by ``labels``) or, headless, an embedder."""
        src = Tensors(strip_prefix(checkpoint.tensors, self.prefix))
        trained_head = src.has(self.head_marker) and checkpoint.embedding is None
        notes: list[str] = []
        if trained_head:
            names = hf_labels(checkpoint.hf)
        elif checkpoint.labels:
            names = checkpoint.labels
            notes.append(f"WARNING: no trained classification head: a random head for {names} was created; "
                         "its scores mean nothing until it is fine-tuned")
        else:
            names = ["unused"]
        config = self.config(checkpoint.hf, checkpoint.specials, names)
        weights = self.encoder_weights(src, config)
        weights |= self.head_weights(src) if trained_head else self.spare_weights(src)
        check_all_read(self.name, src)
        fresh = tuple(p for p in ("pooler.", "cls_head.") if not any(k.startswith(p) for k in weights))
        if trained_head or checkpoint.labels:
            if trained_head and fresh:
                raise CheckpointError(f"{self.name}: the classification head is there but {', '.join(fresh)} is not")
            if "pooler." in fresh:
                notes.append("the checkpoint has no pooler: the pooler is random too")
            model = Classifier(config)
            load_checked(model, weights, "classifier", fresh)
            return Imported("classifier", self.name, model.eval(), checkpoint.hf, config.to_dict(), notes,
                            headless=not trained_head)
        embedding = checkpoint.embedding
        if embedding is None:
            embedding = EmbeddingOptions(pooling="mean", normalize=False)
            notes.append("no trained sequence-classification head: imported as an embedding model with mean "
                         "pooling, not normalised (scripts.import_checkpoint --random-head LABELS creates a random "
                         "classification head to fine-tune instead)")
        limit = min(embedding.max_positions or config.max_positions, config.max_positions)
        embedder = Embedder(config, dataclasses.replace(embedding, max_positions=limit))
        load_checked(embedder.encoder, weights, "classifier", fresh)
        record = {k: v for k, v in config.to_dict().items() if k != "labels"}
        return Imported("embedder", self.name, embedder.eval(), checkpoint.hf, record, notes, headless=True)

    # --- parity against transformers ---

    def reference_inputs(self, tokenizer: Tokenizer, specials: dict[str, int], texts: list[str]) -> dict[str, Tensor]:
        ids, types, mask = padded(tokenizer, texts, specials["pad"])
        with_types = {"token_type_ids": types} if self.token_type_input else {}
        return {"input_ids": ids, **with_types, "attention_mask": mask}

    def reference_output(self, model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
        outputs = model(**inputs)  # a transformers ModelOutput
        if not hasattr(model, "classifier"):  # a headless encoder: compare its hidden states
            return cast(Tensor, outputs.last_hidden_state)
        return cast(Tensor, outputs.logits)

    def our_output(self, model: nn.Module, inputs: dict[str, Tensor], headless: bool) -> Tensor:
        encoder = cast(Classifier, model.encoder if isinstance(model, Embedder) else model)
        args = (inputs["input_ids"], inputs.get("token_type_ids"), inputs["attention_mask"])
        return encoder.encode(*args)[0] if headless or isinstance(model, Embedder) else encoder(*args)[0]

    def graph_output(self, run: GraphRunner, config: dict[str, Any], inputs: dict[str, Tensor]) -> np.ndarray:
        given = numpy_inputs(inputs)
        # The graph's own inputs: BERT's token types, zeros where the reference had none to take.
        names = [i["name"] for i in config["graphs"]["encoder"]["inputs"]]
        outputs = run("encoder", {k: given.get(k, np.zeros_like(given["input_ids"])) for k in names})
        return outputs["logits"] if "logits" in outputs else outputs["embeddings"]

    def compared_positions(self, inputs: dict[str, Tensor]) -> Tensor:
        """Boolean [B, S] of the positions whose [B, S, ...] outputs count (padding is not compared)."""
        return inputs["attention_mask"].bool()


def hf_labels(hf: dict[str, Any]) -> list[str]:
    id2label = hf.get("id2label") or {}
    n = len(id2label) or hf.get("num_labels", 2)
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]


@dataclass(frozen=True)
class DecoderFamily:
    """A decoder-only family that imports into our generator: config and weight mapping, special tokens,
    the transformers class its parity is measured against."""

    name: str  # the HF config.json model_type
    prefix: str  # the base model's prefix inside the causal-LM checkpoint (``model.``); lm_head.weight is outside
    config: Callable[[dict[str, Any], dict[str, int]], GeneratorConfig]  # hf, specials
    weights: Callable[[Tensors, GeneratorConfig, Tensor | None], dict[str, Tensor]]  # base tensors, config, lm_head
    special_tokens: SpecialTokens
    reference_name: str  # the transformers causal-LM class
    dims: ConfigDims
    slow_tokenizer: Callable[[Path], Tokenizer] | None = None

    def reference_class(self, has_head: bool) -> str:
        return self.reference_name

    def languages(self, tokenizer: Tokenizer) -> dict[str, int]:
        return {}

    def import_model(self, checkpoint: Checkpoint) -> Imported:
        raw = checkpoint.tensors
        src = Tensors(strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, self.prefix))
        config = self.config(checkpoint.hf, checkpoint.specials)
        weights = self.weights(src, config, raw.get("lm_head.weight"))
        check_all_read(self.name, src)
        apply_generation_config(config, checkpoint.folder, checkpoint.hf)
        model = Generator(config)
        load_checked(model, weights, "generator")
        return Imported("generator", self.name, model.eval(), checkpoint.hf, config.to_dict(), chat=True)

    def reference_inputs(self, tokenizer: Tokenizer, specials: dict[str, int], texts: list[str]) -> dict[str, Tensor]:
        ids, _, mask = padded(tokenizer, texts, specials["pad"], left=True)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}

    def reference_output(self, model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
        return cast(Tensor, model(**inputs).logits)

    def our_output(self, model: nn.Module, inputs: dict[str, Tensor], headless: bool) -> Tensor:
        return cast(Tensor, model(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"])[0])

    def graph_output(self, run: GraphRunner, config: dict[str, Any], inputs: dict[str, Tensor]) -> np.ndarray:
        given = numpy_inputs(inputs)
        feeds = {k: given[k] for k in ("input_ids", "attention_mask", "position_ids")}
        if not writes_cache_in_place(config):
            return run("decoder", feeds | empty_cache(config, len(given["input_ids"]), "past_key_values"))["logits"]
        # Its rows start at position 0 (right padded), in buffers as long as the batch: shift each row left,
        # run, and shift the logits back.
        B, S = feeds["input_ids"].shape
        shifts = S - feeds["attention_mask"].sum(axis=1)
        aligned = {k: np.stack([np.roll(v[b], -shifts[b]) for b in range(B)]) for k, v in feeds.items()}
        logits = run("decoder", aligned | empty_cache(config, B, "past_key_values", S))["logits"]
        return np.stack([np.roll(logits[b], shifts[b], axis=0) for b in range(B)])

    def compared_positions(self, inputs: dict[str, Tensor]) -> Tensor:
        return inputs["attention_mask"].bool()


@dataclass(frozen=True)
class Seq2SeqFamily:
    """An encoder-decoder family that imports into our translator: config and weight mapping (the base model's
    tensors, the LM head if saved apart), special tokens, language codes, the transformers reference class."""

    name: str  # the HF config.json model_type
    config: Callable[[dict[str, Any], dict[str, int]], TranslatorConfig]  # hf, specials
    weights: Callable[[Tensors, TranslatorConfig, Tensor | None], dict[str, Tensor]]
    special_tokens: SpecialTokens
    languages: Callable[[Tokenizer], dict[str, int]]  # code -> token id; empty: not multilingual
    reference_name: str
    dims: ConfigDims
    generation_config: bool = True  # take generation_config.json's forced and start tokens (T5, M2M100)
    slow_tokenizer: Callable[[Path], Tokenizer] | None = None
    prefix: ClassVar[str] = "model."  # the base model's prefix (T5 has none: nothing to strip)

    def reference_class(self, has_head: bool) -> str:
        return self.reference_name

    def import_model(self, checkpoint: Checkpoint) -> Imported:
        raw = checkpoint.tensors
        src = Tensors(strip_prefix({k: v for k, v in raw.items() if k != "lm_head.weight"}, self.prefix))
        config = self.config(checkpoint.hf, checkpoint.specials)
        config.languages = dict(checkpoint.languages or {})
        if self.generation_config:
            apply_seq2seq_generation_config(config, checkpoint.folder, checkpoint.hf)
        weights = self.weights(src, config, raw.get("lm_head.weight"))
        check_all_read(self.name, src)
        model = Translator(config)
        load_checked(model, weights, "translator")
        return Imported("translator", self.name, model.eval(), checkpoint.hf, config.to_dict())

    def reference_inputs(self, tokenizer: Tokenizer, specials: dict[str, int], texts: list[str]) -> dict[str, Tensor]:
        """Source + a teacher-forced target prefix, one target row right-padded."""
        ids, _, mask = padded(tokenizer, texts, specials["pad"])
        target = torch.cat([torch.full((len(texts), 1), specials["bos"]), ids[:, :4]], dim=1)  # bos + a few tokens
        target_mask = torch.ones_like(target)
        target_mask[-1, 3:] = 0
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": target,
                "decoder_attention_mask": target_mask}

    def reference_output(self, model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
        return cast(Tensor, model(**inputs).logits)

    def our_output(self, model: nn.Module, inputs: dict[str, Tensor], headless: bool) -> Tensor:
        return cast(Tensor, model(inputs["input_ids"], inputs["attention_mask"], inputs["decoder_input_ids"],
                                  inputs["decoder_attention_mask"]))

    def graph_output(self, run: GraphRunner, config: dict[str, Any], inputs: dict[str, Tensor]) -> np.ndarray:
        given = numpy_inputs(inputs)
        encoded = run("encoder", {k: given[k] for k in ("input_ids", "attention_mask")})
        target = given["decoder_input_ids"]
        feeds = {
            "input_ids": target,
            "attention_mask": given["decoder_attention_mask"],
            "position_ids": np.tile(np.arange(target.shape[1]), (len(target), 1)),
            "encoder_attention_mask": given["attention_mask"],
            **{k: v for k, v in encoded.items() if k.startswith("cross.")},
            **empty_cache(config, len(target), "past_key_values"),
        }
        return run("decoder", feeds)["logits"]

    def compared_positions(self, inputs: dict[str, Tensor]) -> Tensor:
        return inputs["decoder_attention_mask"].bool()


Family = EncoderFamily | DecoderFamily | Seq2SeqFamily
