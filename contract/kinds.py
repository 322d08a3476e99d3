"""The registry of tasks and model kinds: which graphs an artifact of each task has and what their
inputs and outputs are called, which special tokens and dimensions its config.json must state, and
which of our model kinds serves each task (the Hugging Face families the importer reads are model/families/).

config.json's ``task`` selects a `Task`; a model *kind* (translator, generator, classifier) is how
model/ builds, trains and exports one, and the default folder (served) name of its artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from contract.names import (
    GraphIO,
    classifier_encoder_io,
    decoder_io,
    embedder_encoder_io,
    translator_encoder_io,
)

ENCODER, DECODER = "encoder", "decoder"
Dims = Mapping[str, int]


def _translation_io(role: str, dims: Dims, logits_to_keep: bool, top_k: bool) -> GraphIO:
    if role == ENCODER:
        return translator_encoder_io(dims["n_encoder_layers"], dims["n_decoder_layers"])
    return decoder_io(dims["n_decoder_layers"], cross=True, top_k=top_k)  # one token per step: nothing to keep


def _generation_io(role: str, dims: Dims, logits_to_keep: bool, top_k: bool) -> GraphIO:
    return decoder_io(dims["n_layers"], cross=False, logits_to_keep=logits_to_keep)


def _token_types(dims: Dims) -> bool:
    """dims.n_token_types: the segment-embedding rows (absent: 2, BERT's; 0: the graph has no token_type_ids)."""
    return dims.get("n_token_types", 2) > 0


def _classification_io(role: str, dims: Dims, logits_to_keep: bool, top_k: bool) -> GraphIO:
    return classifier_encoder_io(dims["n_layers"], _token_types(dims))


def _embedding_io(role: str, dims: Dims, logits_to_keep: bool, top_k: bool) -> GraphIO:
    return embedder_encoder_io(dims["n_layers"], _token_types(dims))


@dataclass(frozen=True)
class Task:
    name: str  # config.json "task"
    architecture: str  # config.json "architecture"
    role_layers: Mapping[str, str]  # graph role -> the dims key counting its layers, in the order they run
    special_tokens: tuple[str, ...]  # the special_tokens the server needs
    pipeline_tag: str  # the Hugging Face pipeline tag (/api/models)
    io: Callable[[str, Dims, bool, bool], GraphIO]
    cache_dim: str | None  # the dims key counting the layers that carry a KV cache
    # config.json names the output classes ("labels"); the graph's logits score them (one each), not the vocabulary
    labels: bool = False
    text_pairs: bool = False  # a request item may be a pair of texts (NLI, a cross-encoder's query and text)
    # The graph pools the encoder's hidden states into one vector per text (config.json "pooling", "normalize",
    # "dimensions_truncatable").
    pooled: bool = False
    # The special tokens the tokenizer frames a text the encoder reads with: role -> its position in the
    # encoding (0: the first token, -1: the last).
    encoding_frame: Mapping[str, int] = field(default_factory=dict)

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.role_layers)

    @property
    def one_step(self) -> bool:
        """One encoder run answers a request (no decoder stepping token by token)."""
        return DECODER not in self.role_layers

    @property
    def cross_attention(self) -> bool:
        """The decoder attends to an encoder's output (its cross-attention keys and values are inputs)."""
        return ENCODER in self.role_layers and DECODER in self.role_layers

    @property
    def layer_dims(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.role_layers.values()))

    def graph_io(self, role: str, dims: Dims, logits_to_keep: bool = False, top_k: bool = False) -> GraphIO:
        """The names of graph ``role`` (``logits_to_keep``: with the generator's optional input; ``top_k``:
        with the translator decoder's scoring head). Without them, what every artifact of the task has."""
        if role not in self.role_layers:
            raise KeyError(f"a {self.name} artifact has no {role!r} graph (roles: {', '.join(self.roles)})")
        return self.io(role, dims, logits_to_keep, top_k)

    def layers(self, role: str, dims: Dims) -> int:
        """Layers of graph ``role``: one ``attentions.{i}`` output each."""
        return dims[self.role_layers[role]]

    def cache_layers(self, dims: Dims) -> int:
        """Layers that carry a KV cache (0 without a decoder)."""
        return dims.get(self.cache_dim, 0) if self.cache_dim else 0


TRANSLATION = Task(
    "translation", "encoder-decoder", {ENCODER: "n_encoder_layers", DECODER: "n_decoder_layers"},
    ("pad", "bos", "eos"), "translation", _translation_io, "n_decoder_layers", encoding_frame={"eos": -1},
)
GENERATION = Task(
    "generation", "decoder-only", {DECODER: "n_layers"}, ("pad", "bos", "eos"), "text-generation", _generation_io,
    "n_layers",
)
CLASSIFICATION = Task(
    "classification", "encoder", {ENCODER: "n_layers"}, ("pad", "cls", "sep"), "text-classification",
    _classification_io, None, labels=True, text_pairs=True, encoding_frame={"cls": 0, "sep": -1},
)
# Sentence embeddings: the encoder's hidden states pooled in the graph (config.json "pooling": mean, cls,
# max or lasttoken); the server normalises them when the request (or config.json "normalize") asks.
POOLING_MODES = ("mean", "cls", "max", "lasttoken")  # config.json "pooling", as sentence-transformers names them
EMBEDDING = Task(
    "embedding", "encoder", {ENCODER: "n_layers"}, ("pad", "cls", "sep"), "feature-extraction", _embedding_io, None,
    pooled=True, encoding_frame={"cls": 0, "sep": -1},
)
TASKS: dict[str, Task] = {t.name: t for t in (TRANSLATION, GENERATION, CLASSIFICATION, EMBEDDING)}


@dataclass(frozen=True)
class Kind:
    name: str  # model/'s model kind, runs/<kind>/, and the default artifact folder (served name)
    task: Task


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("translator", TRANSLATION),
        Kind("generator", GENERATION),
        Kind("classifier", CLASSIFICATION),
    )
}


def graph_file(role: str) -> str:
    """The file the exporter writes graph ``role`` to."""
    return f"{role}.onnx"


def int8_graph_file(role: str) -> str:
    """The file of its dynamic-int8 variant."""
    return f"{role}.int8.onnx"
