"""T5's relative position bias (Raffel et al. 2020): each (query, key) distance falls in a bucket, exact for
short distances and logarithmic up to ``max_distance``; each bucket has a learned bias per head, added to the
attention scores of every layer (the first layer's table, shared). Bidirectional in the encoder (the sign gets
half the buckets), causal in the decoder (keys ahead of the query are never seen, so only distances back count).

Positions are given, not assumed: a decoder step's query sits after the cached keys, and a left-padded row's
positions start at its first real token (model/network/layers.py ``positions_from_mask``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """key position - query position -> bucket index, as transformers' T5 computes it."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        relative = relative.abs()
    else:
        relative = -torch.minimum(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (
        torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    large = torch.minimum(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


class RelativePositionBias(nn.Module):
    def __init__(self, num_buckets: int, max_distance: int, n_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        """[B, S] query and [B, K] key positions -> additive bias [B, H, S, K]."""
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # [B, S, K]
        bucket = relative_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        bias: Tensor = self.embedding(bucket)
        return bias.permute(0, 3, 1, 2)
