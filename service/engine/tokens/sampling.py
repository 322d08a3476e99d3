"""A request's sampling settings (the batch-wide token choice is `service.engine.tokens.chooser`).

The seed belongs to the request, never to the batch, so a request draws the same random numbers whether
it runs alone or next to others (service/engine/tokens/chooser.py says what that guarantees about its tokens).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # CTRL-style, over prompt and generated tokens
    presence_penalty: float = 0.0  # OpenAI-style, over generated tokens
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# The settings a model's generation_config.json may give defaults for (service/runtime/artifact.py).
DEFAULTABLE = ("temperature", "top_k", "top_p", "repetition_penalty")


def with_model_defaults(
    params: SamplingParams, defaults: Mapping[str, Any], given: Collection[str] | None
) -> SamplingParams:
    """``params`` with the model's defaults in the settings the request did not set (``given``: the names it
    set; None: all of them), as vLLM takes a model's generation_config.json."""
    if given is None:
        return params
    taken = {name: defaults[name] for name in DEFAULTABLE if name in defaults and name not in given}
    return replace(params, **taken) if taken else params


def new_seed() -> int:
    # Within the API's seed bound (2**53 - 1): a drawn seed that a response reports can be sent back.
    return secrets.randbits(53)


def logsumexp(x: np.ndarray) -> np.ndarray:
    """Row-wise log-sum-exp in float32 (last axis), with one temporary."""
    top = x.max(axis=-1)
    shifted = np.subtract(x, top[..., None], dtype=np.float32)
    result: np.ndarray = top + np.log(np.exp(shifted, out=shifted).sum(axis=-1))
    return result


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32 (last axis), as the PyTorch reference computes it: one new array."""
    result: np.ndarray = np.subtract(logits, logsumexp(logits)[..., None], dtype=np.float32)
    return result
