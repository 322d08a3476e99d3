"""Encoder-decoder translator (Vaswani et al. 2017) with a shared source/target vocabulary."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from model.config import TranslatorConfig
from model.layers import (
    KeyValue,
    PositionalEncoding,
    TransformerLayer,
    causal_padding_bias,
    padding_bias,
)


class Translator(nn.Module):
    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)  # shared by source, target and output
        self.pos = PositionalEncoding(c.max_positions, c.d_model, c.learned_positions)
        self.dropout = nn.Dropout(c.dropout)
        layer = lambda cross: TransformerLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.activation, cross)  # noqa: E731
        self.encoder_layers = nn.ModuleList(layer(False) for _ in range(c.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(layer(True) for _ in range(c.n_decoder_layers))
        self.ln_enc, self.ln_dec = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight  # weight tying (Press & Wolf 2017)
        nn.init.normal_(self.embed.weight, std=c.d_model**-0.5)

    def embed_tokens(self, ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.dropout(self.embed(ids) * math.sqrt(self.config.d_model) + self.pos(position_ids))

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Source [B, S] (right padded) -> memory [B, S, D] and per-layer attention weights."""
        B, S = src_ids.shape
        positions = torch.arange(S, device=src_ids.device).expand(B, S)
        x = self.embed_tokens(src_ids, positions)
        bias = padding_bias(src_mask, x.dtype)
        weights = []
        for layer in self.encoder_layers:
            x, _, w, _ = layer(x, bias)
            weights.append(w)
        return self.ln_enc(x), weights

    def cross_kv(self, memory: Tensor) -> list[KeyValue]:
        """The encoder-decoder attention K/V of every decoder layer: computed once per source."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]

    def decode(
        self,
        tgt_ids: Tensor,
        tgt_mask: Tensor,
        position_ids: Tensor,
        src_mask: Tensor,
        cross_kv: list[KeyValue],
        past: list[KeyValue] | None = None,
    ) -> tuple[Tensor, list[KeyValue], list[Tensor], list[Tensor]]:
        """New target tokens [B, S] -> (logits [B, S, V], present K/V, self weights, cross weights).

        tgt_mask is [B, P+S] over the cached and the new positions.
        """
        x = self.embed_tokens(tgt_ids, position_ids)
        self_bias = causal_padding_bias(tgt_mask, tgt_ids.shape[1], x.dtype)
        cross_bias = padding_bias(src_mask, x.dtype)
        presents, self_weights, cross_weights = [], [], []
        for i, layer in enumerate(self.decoder_layers):
            x, present, sw, cw = layer(x, self_bias, past[i] if past else None, cross_kv[i], cross_bias)
            presents.append(present)
            self_weights.append(sw)
            cross_weights.append(cw)
        return self.lm_head(self.ln_dec(x)), presents, self_weights, cross_weights

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_ids: Tensor, tgt_mask: Tensor) -> Tensor:
        """Teacher forcing: logits [B, T, V] for every target position at once."""
        memory, _ = self.encode(src_ids, src_mask)
        B, T = tgt_ids.shape
        positions = torch.arange(T, device=tgt_ids.device).expand(B, T)
        logits, _, _, _ = self.decode(tgt_ids, tgt_mask, positions, src_mask, self.cross_kv(memory))
        return logits
