"""Self-attention against key/value buffers that the graph writes in place (an export-time path).

The usual cache (``MultiHeadAttention.forward``) returns ``present = concat(past, new)``: every step copies
the whole cache, and batching rows of different lengths needs left padding. Here each layer's cache is a
buffer of ``capacity`` positions per row ([B, Hkv, capacity, Dh]) that ONNX Runtime's
``com.microsoft.GroupQueryAttention`` writes the new tokens' keys and values into, at each row's own
length, when the caller binds the same buffer as the node's past and present (service/engine/cache/slots.py).
A step then reads the cache and writes one token's worth; rows are right padded, each row's length is
``seqlens_k + 1`` (from the attention mask: ones for a row's past and new tokens, left aligned), and the
node masks causally and past each row's length itself.

There is no eager PyTorch computation of this path: the reference is ``MultiHeadAttention.forward``, and
tests compare the exported graph with it through ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.network.rotary import RotaryAngles, apply_rotary

if TYPE_CHECKING:
    from model.network.layers import KeyValue, MultiHeadAttention

GROUP_QUERY_ATTENTION = "com.microsoft::GroupQueryAttention"


@dataclass(frozen=True)
class InPlaceCache:
    """What the fused node needs besides the layer's tensors, derived once per graph from the mask."""

    seqlens_k: Tensor  # [B] int32: each row's total length (past + new) minus one
    total_length: Tensor  # [] int32: the longest row's total length (the mask's width)

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> InPlaceCache:
        """``attention_mask`` [B, total]: each row's past and new tokens as leading ones."""
        seqlens = attention_mask.sum(dim=1) - 1
        total = torch.tensor(attention_mask.shape[1])
        return cls(seqlens.to(torch.int32), total.to(torch.int32))


def _rotated(x: Tensor, heads: int, d_head: int, rope: RotaryAngles | None) -> Tensor:
    """[B, S, heads * Dh] rotated by the positions' angles (taken [B, 1, S, Dh], applied as [B, S, 1, Dh])."""
    if rope is None:
        return x
    B, S, _ = x.shape
    cos, sin = (angle.transpose(1, 2) for angle in rope)
    return apply_rotary(x.view(B, S, heads, d_head), (cos, sin)).reshape(B, S, heads * d_head)


def in_place_attention(
    attn: MultiHeadAttention, x: Tensor, cache: InPlaceCache, past: KeyValue, rope: RotaryAngles | None
) -> tuple[Tensor, KeyValue]:
    """Causal self-attention of ``x`` [B, S, D] over the row's cached and new tokens; returns the output
    [B, S, D] and the written buffers (the past buffers themselves when bound as one)."""
    q = _rotated(attn.q_proj(x), attn.n_heads, attn.d_head, rope)
    k = _rotated(attn.k_proj(x), attn.n_kv_heads, attn.d_head, rope)
    v = attn.v_proj(x)
    past_key, past_value = past
    out, present_key, present_value = torch.onnx.ops.symbolic_multi_out(
        GROUP_QUERY_ATTENTION,
        (q, k, v, past_key, past_value, cache.seqlens_k, cache.total_length),
        {"num_heads": attn.n_heads, "kv_num_heads": attn.n_kv_heads, "scale": 1.0 / attn.divisor},
        dtypes=(q.dtype, past_key.dtype, past_value.dtype),
        shapes=(q.shape, past_key.shape, past_value.shape),
        version=1,
    )
    return attn.out_proj(out), (present_key, present_value)
