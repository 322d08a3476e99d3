"""Building blocks shared by the three models (Vaswani et al. 2017, pre-LN variant by default).

Every sub-layer is wrapped as ``x + Dropout(SubLayer(LayerNorm(x)))`` (pre-LN,
Xiong et al. 2020): it trains stably with a short warm-up and a high peak rate,
which matters on a CPU budget. Stacks end with a final LayerNorm.

The config's options (model/network/config.py) cover checkpoints trained elsewhere with
the same layers: post-LN ``LayerNorm(x + Dropout(SubLayer(x)))`` without a final
LayerNorm (the original Transformer, BERT, Marian, BART), other activations,
position layouts and offsets, projections without biases, LayerNorm epsilon; and the Llama family's
RMSNorm, rotary positions (model/network/rotary.py), grouped-query attention and gated feed-forward.

The KV cache is explicit: attention takes ``past`` and returns ``present``; no
module keeps state between calls, so the same code exports to ONNX.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.network.config import TransformerConfig
from model.network.in_place import InPlaceCache, in_place_attention
from model.network.rotary import RotaryAngles, apply_rotary

# torch._check is unannotated: a guard on a (symbolic) condition, for export
_check: Callable[[bool], None] = torch._check

KeyValue = tuple[Tensor, Tensor]  # ([B, Hkv, S, Dh], [B, Hkv, S, Dh]); Hkv = H unless grouped-query


def additive_mask(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean "may attend" mask -> additive bias (0 or the dtype's most negative value).

    ``finfo.min`` rather than -inf: a fully masked row (a padding query) then
    softmaxes to a uniform row instead of NaN, and NaN never reaches the cache.
    """
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


def padding_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B, Sk] 0/1 key mask -> [B, 1, 1, Sk] additive bias."""
    return additive_mask(mask[:, None, None, :].bool(), dtype)


def causal_padding_bias(mask: Tensor, query_len: int, dtype: torch.dtype) -> Tensor:
    """Causal + padding bias for queries that are the last ``query_len`` of ``mask``'s positions.

    mask: [B, P+S] over past + new keys. Query i (absolute index P+i) may see key j
    iff j <= P+i and key j is real. Returns [B, 1, S, P+S].
    """
    total = mask.shape[1]
    key_index = torch.arange(total, device=mask.device)
    query_index = torch.arange(query_len, device=mask.device) + (total - query_len)
    causal = key_index[None, :] <= query_index[:, None]  # [S, P+S]
    keep = causal[None, None, :, :] & mask[:, None, None, :].bool()  # [B, 1, S, P+S]
    return additive_mask(keep, dtype)


def sinusoidal_table(max_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...). [max_positions, d_model]

    ``layout="split"`` puts the same sines in the first half and the cosines in the second (Marian);
    it is computed in float64 as Marian does, so an imported model sees the very same table.
    ``layout="fairseq"`` is M2M100's: split too, with its own frequency spacing, in float32.
    """
    if layout == "fairseq":  # M2M100/NLLB: sines then cosines, frequencies spaced over half_dim - 1
        half = d_model // 2
        freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
        angle = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * freq[None, :]
        table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
        return torch.cat([table, torch.zeros(max_positions, d_model % 2)], dim=1)
    if layout == "split":
        position = torch.arange(max_positions, dtype=torch.float64)[:, None]
        angle = position / torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)[:, :d_model].float()
    position = torch.arange(max_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class PositionalEncoding(nn.Module):
    """Position ids -> vectors: the fixed sinusoidal table, or learned embeddings.

    ``offset`` shifts every id before the lookup (BART's learned table keeps 2 rows in front).
    """

    table_buffer: Tensor  # the sinusoidal table, a buffer when not learned

    def __init__(self, max_positions: int, d_model: int, learned: bool = False, layout: str = "interleaved",
                 offset: int = 0) -> None:
        super().__init__()
        self.learned, self.offset = learned, offset
        if learned:
            self.table = nn.Embedding(max_positions + offset, d_model)
            nn.init.normal_(self.table.weight, std=0.02)  # N(0, 1) would drown the token embeddings
        else:
            self.register_buffer("table_buffer", sinusoidal_table(max_positions + offset, d_model, layout),
                                 persistent=False)

    @classmethod
    def from_config(cls, c: TransformerConfig) -> PositionalEncoding:
        return cls(c.max_positions, c.d_model, c.learned_positions, c.sinusoid_layout, c.position_offset)

    def forward(self, position_ids: Tensor) -> Tensor:  # [B, S] -> [B, S, D]
        if self.offset:
            position_ids = position_ids + self.offset
        if self.learned:
            vectors: Tensor = self.table(position_ids)
            return vectors
        return F.embedding(position_ids, self.table_buffer)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019): LayerNorm without the mean or a bias."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def layer_norm(c: TransformerConfig) -> nn.Module:
    """The config's normalization: LayerNorm, or RMSNorm (``norm="rms"``)."""
    if c.norm == "rms":
        return RMSNorm(c.d_model, c.layer_norm_eps)
    return nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)


def final_norm(c: TransformerConfig) -> nn.Module:
    """The LayerNorm that closes a pre-LN stack; post-LN stacks end normalized already."""
    return layer_norm(c) if c.norm_position == "pre" else nn.Identity()


def embedding_norm(c: TransformerConfig) -> nn.Module:
    """LayerNorm of the embedding sum (BERT, BART), or nothing."""
    return layer_norm(c) if c.embedding_layer_norm else nn.Identity()


def embedding_scale(c: TransformerConfig) -> float:
    return math.sqrt(c.d_model) if c.scale_embeddings else 1.0


def lm_head(c: TransformerConfig, embedding: nn.Embedding) -> nn.Linear:
    """Hidden states -> vocabulary logits: tied to ``embedding`` or its own matrix, plus an optional
    final logits bias (zero until trained or imported)."""
    head = nn.Linear(c.d_model, c.vocab_size, bias=c.final_logits_bias)
    if c.tie_output:
        head.weight = embedding.weight  # weight tying (Press & Wolf 2017)
    if head.bias is not None:
        nn.init.zeros_(head.bias)
    return head


def keep_last(x: Tensor, logits_to_keep: Tensor | int) -> Tensor:
    """The last ``logits_to_keep`` positions of ``x`` [B, S, D] (all of them for 0, or for more than S).

    A scalar tensor exports as an input that feeds a dynamic Slice: the generator's prefill then runs
    the LM head at one position instead of the whole prompt (artifacts/README.md, ``logits_to_keep``).
    """
    if isinstance(logits_to_keep, int):
        return x[:, -logits_to_keep:] if logits_to_keep > 0 else x
    length = x.shape[1]
    # an int (a SymInt under export): the tensor holds a position
    start = cast(int, torch.where(logits_to_keep > 0, length - logits_to_keep, 0).clamp(min=0).item())
    _check(start >= 0)
    _check(start <= length)
    return x.narrow(1, start, length - start)


ACTIVATION_MODULES: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # the exact erf form (BERT)
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": nn.SiLU,  # Marian's "swish"
}


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_k) + bias) V per head; heads concatenated, then W_O.

    With ``n_kv_heads`` < ``n_heads`` (grouped-query attention, Ainslie et al. 2023) each key/value head
    serves ``n_heads / n_kv_heads`` query heads: keys and values, and so the cache, hold the K/V heads only.
    ``rope`` rotates queries and keys by their positions (model/network/rotary.py); the cache holds rotated keys.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, bias: bool = True, n_kv_heads: int | None = None,
                 out_bias: bool | None = None, scale: bool = True) -> None:
        super().__init__()
        self.divisor = math.sqrt(d_model // n_heads) if scale else 1.0  # T5 folds it into its initialization
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        kv_dim = self.n_kv_heads * self.d_head
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias if out_bias is None else out_bias)  # W_O
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_config(cls, c: TransformerConfig) -> MultiHeadAttention:
        bias = c.bias if c.qkv_bias is None else c.qkv_bias
        return cls(c.d_model, c.n_heads, c.dropout, bias, c.n_kv_heads, c.out_bias, c.scale_attention)

    def split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        B, S, _ = x.shape
        return x.view(B, S, heads or self.n_heads, self.d_head).transpose(1, 2)  # [B, H, S, Dh]

    def project_kv(self, x: Tensor) -> KeyValue:
        """Keys and values for ``x`` [B, S, D], each [B, Hkv, S, Dh] (the cross-attention K/V of a source)."""
        return self.split_heads(self.k_proj(x), self.n_kv_heads), self.split_heads(self.v_proj(x), self.n_kv_heads)

    def grouped_attention(self, q: Tensor, key: Tensor, value: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """q [B, H, S, Dh] against key/value [B, Hkv, Sk, Dh] -> (weights [B, H, S, Sk], context [B, H, S, Dh]).

        Each query group's heads are stacked as rows against their one K/V head ([B, Hkv, G*S, Dh]), so the
        cache is never copied per query head (expanding it took 10% of a decode step at 2 K/V heads of 8).
        Head h belongs to K/V head h // G, as in transformers' repeat_kv."""
        B, H, S, Dh = q.shape
        Hkv, Sk = self.n_kv_heads, key.shape[-2]
        grouped = q.reshape(B, Hkv, -1, Dh)  # [B, Hkv, G*S, Dh]
        scores = (grouped @ key.transpose(-2, -1)).reshape(B, H, S, Sk) / self.divisor + bias
        weights = scores.softmax(dim=-1)
        context = (self.dropout(weights).reshape(B, Hkv, -1, Sk) @ value).reshape(B, H, S, Dh)
        return weights, context

    def attend(self, x: Tensor, key: Tensor, value: Tensor, bias: Tensor,
               rope: RotaryAngles | None = None) -> tuple[Tensor, Tensor]:
        """Queries from ``x`` [B, S, D] against key/value [B, Hkv, Sk, Dh] -> ([B, S, D], weights [B, H, S, Sk])."""
        B, S, D = x.shape
        q = self.split_heads(self.q_proj(x))  # [B, H, S, Dh]
        if rope is not None:
            q = apply_rotary(q, rope)
        if self.n_kv_heads == self.n_heads:
            scores = q @ key.transpose(-2, -1) / self.divisor + bias  # [B, H, S, Sk]
            weights = scores.softmax(dim=-1)
            context = self.dropout(weights) @ value  # [B, H, S, Dh]
        else:
            weights, context = self.grouped_attention(q, key, value, bias)
        context = context.transpose(1, 2).reshape(B, S, D)  # heads concatenated
        return self.out_proj(context), weights

    def forward(self, x: Tensor, bias: Tensor | InPlaceCache, past: KeyValue | None = None,
                rope: RotaryAngles | None = None) -> tuple[Tensor, KeyValue, Tensor]:
        """Self-attention with an optional cache: returns (output, present K/V incl. past, weights). With an
        ``InPlaceCache`` (export only) ``past`` is a buffer the graph writes into, and no weights come back."""
        if isinstance(bias, InPlaceCache):
            assert past is not None, "the in-place cache writes into the past buffers"
            out, present = in_place_attention(self, x, bias, past, rope)
            return out, present, x.new_zeros(0)
        key, value = self.project_kv(x)
        if rope is not None:
            key = apply_rotary(key, rope)
        if past is not None:
            key = torch.cat([past[0], key], dim=2)  # [B, Hkv, P+S, Dh]
            value = torch.cat([past[1], value], dim=2)
        out, weights = self.attend(x, key, value, bias, rope)
        return out, (key, value), weights


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2 (ReLU as in the paper, GELU for GPT/BERT, SiLU for Marian)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str, bias: bool = True) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff, bias=bias), nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATION_MODULES[activation]()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(self.dropout(self.act(self.fc1(x))))
        return out


class GatedFeedForward(nn.Module):
    """FFN(x) = W_down (act(W_gate x) * W_up x) (Shazeer 2020; SwiGLU with SiLU, as in Llama)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str, bias: bool = False) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(d_model, d_ff, bias=bias), nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATION_MODULES[activation]()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(self.dropout(self.act(self.gate(x)) * self.up(x)))
        return out


def feed_forward(c: TransformerConfig) -> nn.Module:
    bias = c.bias if c.ff_bias is None else c.ff_bias
    kind = GatedFeedForward if c.gated_ff else FeedForward
    return kind(c.d_model, c.d_ff, c.dropout, c.activation, bias)


class TransformerLayer(nn.Module):
    """Self-attention (+ encoder-decoder attention when ``cross``) + FFN, each with a residual and a
    LayerNorm before (pre-LN) or after (post-LN) it, as ``config.norm_position`` says.

    The same layer is the encoder layer (bias = padding), the GPT block (bias = causal)
    and the translator's decoder layer (cross = True).
    """

    def __init__(self, c: TransformerConfig, cross: bool = False) -> None:
        super().__init__()
        self.pre_ln = c.norm_position == "pre"
        self.ln_self = layer_norm(c)
        self.self_attn = MultiHeadAttention.from_config(c)
        self.ln_cross = layer_norm(c) if cross else None
        self.cross_attn = (MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.bias, scale=c.scale_attention)
                           if cross else None)
        self.ln_ff = layer_norm(c)
        self.ff = feed_forward(c)
        self.dropout = nn.Dropout(c.dropout)

    def sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.pre_ln else x

    def add_residual(self, x: Tensor, out: Tensor, norm: nn.Module) -> Tensor:
        """Pre-LN: x + f(LN(x)); post-LN: LN(x + f(x))."""
        x = x + self.dropout(out)
        return x if self.pre_ln else norm(x)

    def forward(
        self,
        x: Tensor,
        self_bias: Tensor | InPlaceCache,
        past: KeyValue | None = None,
        cross_kv: KeyValue | None = None,
        cross_bias: Tensor | None = None,
        rope: RotaryAngles | None = None,
    ) -> tuple[Tensor, KeyValue, Tensor, Tensor | None]:
        """Returns (x, present self-attention K/V, self-attention weights, cross-attention weights or None)."""
        attn_out, present, self_weights = self.self_attn(self.sublayer_input(x, self.ln_self), self_bias, past, rope)
        x = self.add_residual(x, attn_out, self.ln_self)
        cross_weights = None
        if self.cross_attn is not None:
            assert cross_kv is not None and cross_bias is not None, "a decoder layer needs the encoder K/V"
            assert self.ln_cross is not None  # built with cross_attn
            cross_in = self.sublayer_input(x, self.ln_cross)
            cross_out, cross_weights = self.cross_attn.attend(cross_in, *cross_kv, cross_bias)
            x = self.add_residual(x, cross_out, self.ln_cross)
        x = self.add_residual(x, self.ff(self.sublayer_input(x, self.ln_ff)), self.ln_ff)
        return x, present, self_weights, cross_weights


def positions_from_mask(mask: Tensor, query_len: int) -> Tensor:
    """Left-padding-aware position ids for the last ``query_len`` positions: cumsum(mask) - 1, clipped at 0."""
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    return positions[:, mask.shape[1] - query_len :]
