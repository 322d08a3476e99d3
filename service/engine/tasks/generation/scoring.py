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

from contract.names import ATTENTION_MASK, PAST, POSITION_IDS, PRESENT
from service.engine.cache.appended import KVCache, kv_names
from service.engine.errors import QueueFull, RequestTimeout
from service.engine.scheduling import MAX_PREFILL_TOKENS
from service.engine.tokens.sampling import log_softmax
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

    def _run_in_place(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """[B, S, V] logits of left-aligned prompts, through scratch buffers as long as the longest prompt."""
        B, S = ids.shape
        n_layers, n_kv_heads, d_head = self.shape
        cache = {
            past: (present, np.zeros((B, n_kv_heads, S, d_head), dtype=np.float32))
            for past, present in zip(kv_names(PAST, n_layers), kv_names(PRESENT, n_layers), strict=True)
        }
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        feeds = {"input_ids": ids, ATTENTION_MASK: mask, POSITION_IDS: positions}
        return self.session.run_in_place(feeds, ["logits"], cache)["logits"]

    def _score_chunk(self, prompts: list[list[int]], top_k: int) -> list[list[TokenScore]]:
        B, S = len(prompts), max(len(p) for p in prompts)
        in_place = self.session.spec.writes_cache_in_place
        ids = np.full((B, S), self.pad, dtype=np.int64)
        mask = np.zeros((B, S), dtype=np.int64)
        for b, prompt in enumerate(prompts):  # right aligned (left padded), or left aligned for an in-place cache
            span = slice(0, len(prompt)) if in_place else slice(S - len(prompt), S)
            ids[b, span] = prompt
            mask[b, span] = 1
        if in_place:
            logits = self._run_in_place(ids, mask)
            # Right aligned as below: row b's positions 0 .. n-1 move to S-n .. S-1.
            logits = np.stack([np.roll(row, S - len(p), axis=0) for row, p in zip(logits, prompts, strict=True)])
        else:
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
