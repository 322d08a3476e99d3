"""The modules the exporter traces: each network wrapped as flat tensors in, flat tensors out, in the
contract's order (contract/names.py), the KV cache as (key, value) pairs flattened."""

from __future__ import annotations

from torch import Tensor, nn

from model.network.classifier import Classifier
from model.network.config import ClassifierConfig
from model.network.embedder import Embedder
from model.network.generator import Generator
from model.network.translator import Translator


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
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, encoder_attention_mask: Tensor,
        *caches: Tensor,
    ) -> tuple[Tensor, ...]:
        n = 2 * self.model.config.n_decoder_layers
        cross, past = pairs(caches[:n]), pairs(caches[n:])
        logits, present, self_w, cross_w = self.model.decode(
            input_ids, attention_mask, position_ids, encoder_attention_mask, cross, past
        )
        return (logits, *flatten(present), *self_w, *cross_w)


class GeneratorGraph(nn.Module):
    """The generator's decoder; with ``logits_to_keep``, its last input is that scalar (after the cache).
    ``in_place``: the cache inputs are buffers the graph writes into (model/network/in_place.py)."""

    def __init__(self, model: Generator, logits_to_keep: bool, in_place: bool = False) -> None:
        super().__init__()
        self.model = model
        self.logits_to_keep = logits_to_keep
        self.in_place = in_place

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *rest: Tensor
    ) -> tuple[Tensor, ...]:
        past, keep = (rest[:-1], rest[-1]) if self.logits_to_keep else (rest, 0)
        logits, present, weights = self.model(input_ids, attention_mask, position_ids, pairs(past), keep, self.in_place)
        return (logits, *flatten(present), *weights)


class EncoderGraph(nn.Module):
    """A classifier's (logits) or an embedder's (embeddings) encoder graph: (input_ids, token_type_ids,
    attention_mask), or (input_ids, attention_mask) for families without a token-type input."""

    def __init__(self, model: Classifier | Embedder) -> None:
        super().__init__()
        self.model = model
        self.token_types = has_token_type_input(model.config)

    def forward(self, input_ids: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        token_type_ids, attention_mask = (rest[0], rest[1]) if self.token_types else (None, rest[0])
        output, weights = self.model(input_ids, token_type_ids, attention_mask)
        return (output, *weights)


def has_token_type_input(config: ClassifierConfig) -> bool:
    """A graph takes token_type_ids when the model has two or more segment rows; with one (RoBERTa) that row
    is added to every token, with none (DistilBERT) there is nothing to add."""
    return config.type_vocab_size > 1
