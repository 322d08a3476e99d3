"""Graph input and output names: what the exporter calls each tensor and what the server feeds and reads.

Caches come in key/value pairs per layer (``present.0.key``, ``present.0.value``, ...); attention maps
are one output per layer (``attentions.0``, ...) and optional. ``logits_to_keep`` is an optional input
of the generator graph (a scalar with default 0): logits for the last k new positions only, 0 for all.
A translator decoder exported with the top-k head also outputs ``top_logprobs`` and ``top_ids``: the
last position's k best log-probabilities and token ids, for its optional input ``k`` ([1], default 0: none).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
POSITION_IDS = "position_ids"
ENCODER_ATTENTION_MASK = "encoder_attention_mask"
LOGITS_TO_KEEP = "logits_to_keep"
LOGITS = "logits"
EMBEDDINGS = "embeddings"  # an embedder's pooled sentence vectors [batch, d_model], not normalised

# The server's scoring head (service/runtime/scoring_head.onnx, built by model/export/scoring_graph.py): logits
# [rows, vocab] and k [1] in; each row's k best log-probabilities and their token ids out, best first.
# A translator decoder may carry the same head (`decoder_io`'s ``top_k``).
TOP_K = "k"
TOP_LOGPROBS = "top_logprobs"
TOP_IDS = "top_ids"

PAST = "past_key_values"  # inputs: the self-attention cache so far
PRESENT = "present"  # outputs: the cache after this call (past + new positions)
# The cache inputs' position axis when they are buffers the graph writes into (model/network/in_place.py)
IN_PLACE_AXIS = "capacity"
CROSS = "cross"  # the encoder-decoder attention K/V (translator encoder outputs, decoder inputs)
ATTENTIONS = "attentions"
CROSS_ATTENTIONS = "cross_attentions"

KV_PREFIXES = (f"{PAST}.", f"{PRESENT}.", f"{CROSS}.")
ATTENTION_PREFIXES = (f"{ATTENTIONS}.", f"{CROSS_ATTENTIONS}.")
KV_PARTS = ("key", "value")


@functools.cache  # the engine asks at every decode step
def kv_names(prefix: str, n_layers: int) -> tuple[str, ...]:
    """``prefix.i.key``, ``prefix.i.value`` for each layer, in the graphs' order."""
    return tuple(f"{prefix}.{i}.{part}" for i in range(n_layers) for part in KV_PARTS)


def layer_names(prefix: str, n_layers: int) -> list[str]:
    """One name per layer: ``attentions.0``, ``attentions.1``, ..."""
    return [f"{prefix}.{i}" for i in range(n_layers)]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input as config.json records it (the exporter writes it, the server and golden records read it)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]  # symbolic axes by name ("batch", "seq", "past", ...)
    default: int | None = None  # an optional input: the value the graph uses when it is not fed


@dataclass(frozen=True)
class GraphIO:
    """The names of one graph, in the order the exporter writes them."""

    inputs: tuple[str, ...]  # all required
    outputs: tuple[str, ...]  # all required
    attention: tuple[str, ...] = ()  # optional outputs (attention maps)
    optional_inputs: tuple[str, ...] = ()  # inputs with a default in the graph; exported after `inputs`

    @property
    def all_outputs(self) -> tuple[str, ...]:
        return (*self.outputs, *self.attention)


def encoder_io(n_layers: int, output: str, token_types: bool) -> GraphIO:
    """A BERT-like encoder: a classifier's (``logits``) or an embedder's (``embeddings``). Families without
    segment embeddings (RoBERTa, XLM-RoBERTa, DistilBERT) have no ``token_type_ids`` input."""
    return GraphIO(
        inputs=(INPUT_IDS, *((TOKEN_TYPE_IDS,) if token_types else ()), ATTENTION_MASK),
        outputs=(output,),
        attention=tuple(layer_names(ATTENTIONS, n_layers)),
    )


def classifier_encoder_io(n_layers: int, token_types: bool = True) -> GraphIO:
    return encoder_io(n_layers, LOGITS, token_types)


def embedder_encoder_io(n_layers: int, token_types: bool = True) -> GraphIO:
    return encoder_io(n_layers, EMBEDDINGS, token_types)


def translator_encoder_io(n_encoder_layers: int, n_decoder_layers: int) -> GraphIO:
    return GraphIO(
        inputs=(INPUT_IDS, ATTENTION_MASK),
        outputs=tuple(kv_names(CROSS, n_decoder_layers)),
        attention=tuple(layer_names(ATTENTIONS, n_encoder_layers)),
    )


def decoder_io(n_layers: int, cross: bool, logits_to_keep: bool = False, top_k: bool = False) -> GraphIO:
    """A decoder with a KV cache: the generator's (``cross=False``) or the translator's; ``top_k``: with the
    scoring head's input and outputs (model/export/scoring_graph.py::append_head)."""
    inputs = [INPUT_IDS, ATTENTION_MASK, POSITION_IDS]
    attention = layer_names(ATTENTIONS, n_layers)
    if cross:
        inputs += [ENCODER_ATTENTION_MASK, *kv_names(CROSS, n_layers)]
        attention += layer_names(CROSS_ATTENTIONS, n_layers)
    return GraphIO(
        inputs=(*inputs, *kv_names(PAST, n_layers)),
        outputs=(LOGITS, *kv_names(PRESENT, n_layers), *((TOP_LOGPROBS, TOP_IDS) if top_k else ())),
        attention=tuple(attention),
        optional_inputs=(*((LOGITS_TO_KEEP,) if logits_to_keep else ()), *((TOP_K,) if top_k else ())),
    )


# The named special tokens transformers' apply_chat_template passes to a chat template (as text), which an
# artifact's config.json `chat_template.special_tokens` may carry.
CHAT_TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
