"""GPT-style decoder-only language model (Radford et al. 2018), next-token objective.

With ``config.rotary`` positions are rotations of queries and keys (the Llama family) instead of vectors
added to the token embeddings.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model.network import layers
from model.network.config import GeneratorConfig
from model.network.in_place import InPlaceCache
from model.network.rotary import RotaryEmbedding


class Generator(nn.Module):
    def __init__(self, config: GeneratorConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = None if c.rotary else layers.PositionalEncoding.from_config(c)
        self.rotary = RotaryEmbedding.from_config(c) if c.rotary else None
        self.emb_scale = layers.embedding_scale(c)
        self.ln_emb = layers.embedding_norm(c)
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(layers.TransformerLayer(c) for _ in range(c.n_layers))
        self.ln_f = layers.final_norm(c)
        self.lm_head = layers.lm_head(c, self.tok_emb)
        nn.init.normal_(self.tok_emb.weight, std=c.d_model**-0.5)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past: list[layers.KeyValue] | None = None,
        logits_to_keep: Tensor | int = 0,
        in_place: bool = False,
    ) -> tuple[Tensor, list[layers.KeyValue], list[Tensor]]:
        """[B, S] new tokens (+ cache of P) -> (logits [B, S, V], present K/V [B, Hkv, P+S, Dh], weights).

        attention_mask covers past + new positions ([B, P+S]); defaults to all ones. ``logits_to_keep``
        > 0 computes the logits of the last that many positions only ([B, min(k, S), V]). ``in_place``
        (export only, model/network/in_place.py): ``past`` are buffers the graph writes the new keys and values
        into, ``attention_mask`` marks each row's past and new tokens as leading ones, and no weights come back.
        """
        B, S = input_ids.shape
        if attention_mask is None:
            past_len = past[0][0].shape[2] if past else 0
            attention_mask = torch.ones(B, past_len + S, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(S, device=input_ids.device).expand(B, S)
        # Token embeddings scaled by sqrt(d_model) (the default, as in the paper) match the sinusoids' unit scale.
        x = self.tok_emb(input_ids) * self.emb_scale
        if self.pos is not None:
            x = x + self.pos(position_ids)
        x = self.dropout(self.ln_emb(x))
        rope = self.rotary(position_ids) if self.rotary is not None else None
        bias: Tensor | InPlaceCache = (
            InPlaceCache.from_mask(attention_mask)
            if in_place
            else layers.causal_padding_bias(attention_mask, S, x.dtype)
        )
        presents, weights = [], []
        for i, block in enumerate(self.blocks):
            x, present, w, _ = block(x, bias, past[i] if past else None, rope=rope)
            presents.append(present)
            weights.extend([] if in_place else [w])
        return self.lm_head(layers.keep_last(self.ln_f(x), logits_to_keep)), presents, weights
