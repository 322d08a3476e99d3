"""Rotary position embeddings (Su et al. 2021) as the Llama family computes them.

Queries and keys are rotated in the "half" layout (``rotate_half``: the first half of each head's
dimensions pairs with the second), by angles ``position * inv_freq``. ``inv_freq`` follows the
checkpoint's ``rope_theta`` and ``rope_scaling``: default, linear (positions interpolated by ``factor``)
and llama3 (low frequencies divided by ``factor``, a smooth ramp between). The angles are computed from
the position ids inside the graph, so left padding and a KV cache need nothing more than position ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from model.network.config import TransformerConfig

RotaryAngles = tuple[Tensor, Tensor]  # cos, sin: [B, 1, S, Dh], broadcast over heads


def rope_type(scaling: dict[str, Any] | None) -> str:
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def linear_frequencies(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Positions interpolated by ``factor``."""
    factor: float = scaling["factor"]
    return inv_freq / factor


def llama3_frequencies(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1's scaling: wavelengths beyond the original context are stretched by ``factor``, those
    below ``original / high_freq_factor`` kept, the band between interpolated."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


# rope_scaling's type -> how it rescales the default inverse frequencies.
SCALINGS: dict[str, Callable[[Tensor, dict[str, Any]], Tensor]] = {
    "default": lambda inv_freq, scaling: inv_freq,
    "linear": linear_frequencies,
    "llama3": llama3_frequencies,
}
ROPE_TYPES = tuple(SCALINGS)


def inverse_frequencies(d_head: int, theta: float, scaling: dict[str, Any] | None) -> Tensor:
    """[d_head / 2] float32 inverse frequencies, as transformers' ROPE_INIT_FUNCTIONS compute them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))
    kind = rope_type(scaling)
    if kind not in SCALINGS:
        raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    return SCALINGS[kind](inv_freq, scaling or {})


class RotaryEmbedding(nn.Module):
    """Position ids -> (cos, sin) of the rotation angles, shared by every layer."""

    inv_freq: Tensor  # a buffer

    def __init__(self, d_head: int, theta: float, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        # Not a weight: recomputed from the config, never saved, never rounded to fp16.
        self.register_buffer("inv_freq", inverse_frequencies(d_head, theta, scaling), persistent=False)

    @classmethod
    def from_config(cls, c: TransformerConfig) -> RotaryEmbedding:
        return cls(c.d_head, c.rope_theta, c.rope_scaling)

    def forward(self, position_ids: Tensor) -> RotaryAngles:  # [B, S] -> 2 x [B, 1, S, Dh]
        angles = position_ids[..., None].float() * self.inv_freq  # [B, S, Dh/2]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos()[:, None], angles.sin()[:, None]


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: Tensor, angles: RotaryAngles) -> Tensor:
    """Rotate queries or keys [B, H, S, Dh] by their positions' angles."""
    cos, sin = angles
    return x * cos + rotate_half(x) * sin
