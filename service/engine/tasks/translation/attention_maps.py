"""A translation's attention maps (return_attention): which outputs of the translator's graphs hold them,
the encoder's maps of the sources that asked, each decoder step's maps per row, and the JSON a result carries."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from contract.names import ATTENTIONS, CROSS_ATTENTIONS, layer_names
from service.engine.attention import RowAttention, to_json
from service.engine.tasks.translation.beam_search import Finished
from service.runtime.sessions import GraphSession


class AttentionOutputs:
    """The attention outputs of a translator's graphs: every layer's of both graphs, or none (the graphs
    were exported without them, and no maps are served)."""

    def __init__(self, encoder: GraphSession, decoder: GraphSession, n_encoder_layers: int, n_layers: int) -> None:
        enc_attn = layer_names(ATTENTIONS, n_encoder_layers)
        dec_attn = layer_names(ATTENTIONS, n_layers) + layer_names(CROSS_ATTENTIONS, n_layers)
        has_attention = all(encoder.has_output(n) for n in enc_attn) and all(decoder.has_output(n) for n in dec_attn)
        self.encoder = enc_attn if has_attention else []
        self.decoder = dec_attn if has_attention else []  # each layer's self-attention, then each one's cross
        self.n_layers = n_layers

    def of_sources(self, out: Mapping[str, Any], lengths: list[int]) -> list[list[np.ndarray]]:
        """Each source's encoder maps from an encoder run's outputs, cut to its length (sources are right-padded)."""
        return [[out[name][i, :, :n, :n].copy() for name in self.encoder] for i, n in enumerate(lengths)]

    def record(
        self, rows: list[RowAttention | None], out: Mapping[str, Any], keys: np.ndarray, sources: np.ndarray
    ) -> None:
        """One decoder step's maps, added to each row that asked for them: self-attention over the row's
        keys (``keys``: the cache's mask, left padding dropped), cross-attention over its source (``sources``:
        the source mask, right padding dropped)."""
        self_maps, cross_maps = self.decoder[: self.n_layers], self.decoder[self.n_layers :]
        for row, maps in enumerate(rows):
            if maps is not None:
                kept = keys[row].astype(bool)
                src = int(sources[row].sum())
                # Copies (the mask indexing copies already): a view would keep every row's step maps.
                maps.record(
                    [out[name][row][:, :, kept] for name in self_maps],
                    [out[name][row][:, :, :src].copy() for name in cross_maps],
                )


def attention_json(
    names: Callable[[int], str | None],
    bos: int,
    n_heads: int,
    src: list[int],
    best: Finished,
    encoder: list[np.ndarray],
) -> dict[str, Any]:
    """A result's maps: the best hypothesis's decoder and cross-attention, the source's encoder maps, and
    the tokens along their axes (``names``: the tokenizer's id -> token)."""
    maps = best.extra.maps(len(best.tokens), n_heads, len(src))
    return {
        "source_tokens": [names(t) for t in src],
        "target_tokens": [names(t) for t in best.tokens],
        "decoder_input_tokens": [names(t) for t in [bos, *best.tokens[:-1]]],
        "encoder": [to_json(a) for a in encoder],
        **maps,
    }
