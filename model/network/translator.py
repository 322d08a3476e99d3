"""Encoder-decoder translator (Vaswani et al. 2017) with a shared source/target vocabulary."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from model.network import layers
from model.network.config import TranslatorConfig
from model.network.relative_position import RelativePositionBias


class Translator(nn.Module):
    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)  # shared by source, target and output
        relative = c.relative_buckets > 0  # T5: a bias on the attention scores instead of position vectors
        self.pos = None if relative else layers.PositionalEncoding.from_config(c)
        self.pos_dec = layers.PositionalEncoding.from_config(c) if c.separate_decoder_positions else None
        self.rel_enc: RelativePositionBias | None
        self.rel_dec: RelativePositionBias | None
        self.rel_enc, self.rel_dec = (
            (RelativePositionBias(c.relative_buckets, c.relative_max_distance, c.n_heads, bidirectional)
             for bidirectional in (True, False)) if relative else (None, None))
        self.output_scale = c.d_model**-0.5 if c.rescale_output else 1.0
        self.emb_scale = layers.embedding_scale(c)
        # BART normalizes each side's embeddings with its own LayerNorm
        self.ln_emb_enc, self.ln_emb_dec = layers.embedding_norm(c), layers.embedding_norm(c)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder_layers = nn.ModuleList(layers.TransformerLayer(c) for _ in range(c.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(layers.TransformerLayer(c, cross=True) for _ in range(c.n_decoder_layers))
        self.ln_enc, self.ln_dec = layers.final_norm(c), layers.final_norm(c)
        self.lm_head = layers.lm_head(c, self.embed)
        nn.init.normal_(self.embed.weight, std=c.d_model**-0.5)

    def embed_tokens(self, ids: Tensor, position_ids: Tensor, decoder: bool) -> Tensor:
        pos, norm = (self.pos_dec or self.pos, self.ln_emb_dec) if decoder else (self.pos, self.ln_emb_enc)
        x = self.embed(ids) * self.emb_scale
        embedded: Tensor = self.dropout(norm(x if pos is None else x + pos(position_ids)))
        return embedded

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Source [B, S] (right padded) -> memory [B, S, D] and per-layer attention weights."""
        B, S = src_ids.shape
        positions = torch.arange(S, device=src_ids.device).expand(B, S)
        x = self.embed_tokens(src_ids, positions, decoder=False)
        bias = layers.padding_bias(src_mask, x.dtype)
        if self.rel_enc is not None:
            bias = bias + self.rel_enc(positions, positions)
        weights = []
        for layer in self.encoder_layers:
            x, _, w, _ = layer(x, bias)
            weights.append(w)
        return self.ln_enc(x), weights

    def cross_kv(self, memory: Tensor) -> list[layers.KeyValue]:
        """The encoder-decoder attention K/V of every decoder layer: computed once per source."""
        decoder_layers = cast(list[layers.TransformerLayer], list(self.decoder_layers))  # built with cross=True
        return [layer.cross_attn.project_kv(memory) for layer in decoder_layers if layer.cross_attn is not None]

    def decode(
        self,
        tgt_ids: Tensor,
        tgt_mask: Tensor,
        position_ids: Tensor,
        src_mask: Tensor,
        cross_kv: list[layers.KeyValue],
        past: list[layers.KeyValue] | None = None,
    ) -> tuple[Tensor, list[layers.KeyValue], list[Tensor], list[Tensor]]:
        """New target tokens [B, S] -> (logits [B, S, V], present K/V, self weights, cross weights).

        tgt_mask is [B, P+S] over the cached and the new positions.
        """
        x = self.embed_tokens(tgt_ids, position_ids, decoder=True)
        self_bias = layers.causal_padding_bias(tgt_mask, tgt_ids.shape[1], x.dtype)
        if self.rel_dec is not None:  # queries after the cached keys; keys at their left-padding-aware positions
            self_bias = self_bias + self.rel_dec(position_ids, layers.positions_from_mask(tgt_mask, tgt_mask.shape[1]))
        cross_bias = layers.padding_bias(src_mask, x.dtype)
        presents, self_weights, cross_weights = [], [], []
        for i, layer in enumerate(self.decoder_layers):
            x, present, sw, cw = layer(x, self_bias, past[i] if past else None, cross_kv[i], cross_bias)
            presents.append(present)
            self_weights.append(sw)
            cross_weights.append(cw)
        return self.lm_head(self.ln_dec(x) * self.output_scale), presents, self_weights, cross_weights

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_ids: Tensor, tgt_mask: Tensor) -> Tensor:
        """Teacher forcing: logits [B, T, V] for every target position at once."""
        memory, _ = self.encode(src_ids, src_mask)
        B, T = tgt_ids.shape
        positions = torch.arange(T, device=tgt_ids.device).expand(B, T)
        logits, _, _, _ = self.decode(tgt_ids, tgt_mask, positions, src_mask, self.cross_kv(memory))
        return logits
