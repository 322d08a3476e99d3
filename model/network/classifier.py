"""BERT-style encoder (Devlin et al. 2019): token + segment + position embeddings,
MLM and NSP pretraining heads, and a classification head on [CLS]."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model.network import layers
from model.network.config import ClassifierConfig


class Classifier(nn.Module):
    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        # Segment embeddings: none when type_vocab_size is 0 (DistilBERT); one row (RoBERTa) is added to every token.
        self.seg_emb = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        self.pos = layers.PositionalEncoding.from_config(c)
        self.emb_scale = layers.embedding_scale(c)
        self.ln_emb = layers.embedding_norm(c)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(layers.TransformerLayer(c) for _ in range(c.n_layers))
        self.ln_f = layers.final_norm(c)
        # Pooler on [CLS], shared by NSP and fine-tuning as in BERT (or [CLS] as it is).
        pooler_activation = nn.Tanh() if c.pooler_activation == "tanh" else nn.ReLU()  # ReLU: DistilBERT's head
        self.pooler = nn.Sequential(nn.Linear(c.d_model, c.d_model), pooler_activation) if c.pooler else nn.Identity()
        self.nsp_head = nn.Linear(c.d_model, 2)
        self.cls_head = nn.Linear(c.d_model, len(c.labels))
        self.mlm_transform = nn.Sequential(nn.Linear(c.d_model, c.d_model), nn.GELU(), layers.layer_norm(c))
        self.mlm_bias = nn.Parameter(torch.zeros(c.vocab_size))
        for emb in (self.tok_emb, self.seg_emb):
            if emb is not None:
                nn.init.normal_(emb.weight, std=0.02)

    def encode(self, input_ids: Tensor, token_type_ids: Tensor | None,
               attention_mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        """[B, S] -> hidden states [B, S, D] and per-layer attention weights [B, H, S, S].

        ``token_type_ids`` None: segment 0 everywhere (the graphs of families without a token-type input)."""
        B, S = input_ids.shape
        positions = torch.arange(S, device=input_ids.device).expand(B, S)
        x = self.tok_emb(input_ids) * self.emb_scale
        if self.seg_emb is not None:
            x = x + (self.seg_emb(token_type_ids) if token_type_ids is not None else self.seg_emb.weight[0])
        x = x + self.pos(positions)
        x = self.dropout(self.ln_emb(x))
        bias = layers.padding_bias(attention_mask, x.dtype)
        weights = []
        for layer in self.layers:
            x, _, w, _ = layer(x, bias)
            weights.append(w)
        return self.ln_f(x), weights

    def layer_depth(self, name: str) -> tuple[int, int]:
        """(depth, top) of a parameter for layer-wise rate decay: the embeddings are 0, layer i is i + 1,
        everything above the last layer (final norm, pooler, heads) is the top, n_layers + 1."""
        top = self.config.n_layers + 1
        if name.startswith("layers."):
            return int(name.split(".")[1]) + 1, top
        if name.startswith(("tok_emb.", "seg_emb.", "pos.", "ln_emb.")):
            return 0, top
        return top, top

    def pooled(self, hidden: Tensor) -> Tensor:
        pooled: Tensor = self.dropout(self.pooler(hidden[:, 0]))  # the [CLS] position
        return pooled

    def sentence_vector(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """What the classification head reads (config.pooling)."""
        if self.config.pooling == "cls":
            return self.pooled(hidden)
        real = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean: Tensor = self.dropout((hidden * real).sum(1) / real.sum(1).clamp(min=1.0))
        return mean

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Masked-token logits, decoder tied to the token embeddings. [..., D] -> [..., V]"""
        transformed: Tensor = self.mlm_transform(hidden)
        return transformed @ self.tok_emb.weight.T + self.mlm_bias

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None,
                attention_mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Fine-tuned classification: (label logits [B, num_labels], attention weights)."""
        hidden, weights = self.encode(input_ids, token_type_ids, attention_mask)
        return self.cls_head(self.sentence_vector(hidden, attention_mask)), weights
