"""Prompt scoring: the log-probability of every prompt token given the ones before it (OpenAI's
`echo` + `logprobs`, used by evaluation harnesses for loglikelihood and perplexity).

One uncached forward pass per prompt over the whole prompt; it runs on the generator's own worker
thread, so it never competes with the decode loop for the session from another thread.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from service.engine.errors import QueueFull, RequestTimeout
from service.engine.kv import KVCache
from service.engine.sampling import log_softmax
from service.engine.scheduling import MAX_PREFILL_TOKENS
from service.runtime.sessions import GraphSession
from service.settings import Settings


@dataclass(frozen=True)
class TokenScore:
    id: int
    logprob: float | None  # None for the first token: nothing precedes it
    top: list[tuple[int, float]] | None  # the k most likely ids at this position, best first


class Scorer(Protocol):
    """Scores prompts: the generator's PromptScorer, or a front end's stand-in that asks the engine process."""

    async def score(self, prompts: list[list[int]], top_k: int, deadline: float | None) -> list[list[TokenScore]]: ...


@dataclass(eq=False)
class PromptScorer:
    name: str
    session: GraphSession
    settings: Settings
    executor: Executor  # the generator's worker thread
    shape: tuple[int, int, int]  # the KV cache's (n_layers, n_kv_heads, d_head)
    pad: int
    pending: int = field(default=0, init=False)  # requests waiting for or running on the worker thread

    async def score(self, prompts: list[list[int]], top_k: int, deadline: float | None) -> list[list[TokenScore]]:
        """Each prompt's token scores; a 429 when max_queue_size scoring requests already wait."""
        if self.pending >= self.settings.max_queue_size:
            raise QueueFull(f"{self.name}: too many scoring requests waiting (limit {self.settings.max_queue_size})")
        self.pending += 1
        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, self.score_now, prompts, top_k)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise RequestTimeout("the request did not finish within SERVE_REQUEST_TIMEOUT_S") from None
        finally:
            self.pending -= 1

    def score_now(self, prompts: list[list[int]], top_k: int) -> list[list[TokenScore]]:
        """Blocking. Prompts run in left-padded chunks of at most MAX_PREFILL_TOKENS padded tokens."""
        results: list[list[TokenScore]] = []
        chunk: list[list[int]] = []
        for ids in prompts:
            longest = max([len(ids), *(len(c) for c in chunk)])
            if chunk and longest * (len(chunk) + 1) > MAX_PREFILL_TOKENS:
                results += self._score_chunk(chunk, top_k)
                chunk = []
            chunk.append(ids)
        if chunk:
            results += self._score_chunk(chunk, top_k)
        return results

    def _score_chunk(self, prompts: list[list[int]], top_k: int) -> list[list[TokenScore]]:
        B, S = len(prompts), max(len(p) for p in prompts)
        ids = np.full((B, S), self.pad, dtype=np.int64)
        mask = np.zeros((B, S), dtype=np.int64)
        for b, prompt in enumerate(prompts):
            ids[b, S - len(prompt) :] = prompt
            mask[b, S - len(prompt) :] = 1
        empty = KVCache.empty(B, *self.shape)
        logits = self.session.run({"input_ids": ids, **empty.feeds(mask)}, ["logits"])["logits"]  # [B, S, V]
        scores = []
        for b, prompt in enumerate(prompts):
            n = len(prompt)
            # Position i predicts token i + 1: the logits of positions S-n .. S-2 score tokens 1 .. n-1.
            lp = log_softmax(logits[b, S - n : S - 1]) if n > 1 else np.zeros((0, logits.shape[-1]))
            row = [TokenScore(prompt[0], None, None)]
            for i in range(1, n):
                top = None
                if top_k > 0:
                    best = np.argsort(-lp[i - 1], kind="stable")[:top_k]
                    top = [(int(t), float(lp[i - 1, t])) for t in best]
                row.append(TokenScore(prompt[i], float(lp[i - 1, prompt[i]]), top))
            scores.append(row)
        return scores
