"""A generator's newcomers before they decode: their prompts fed to the graph, a bounded chunk per scheduler
step while a batch decodes (chunked prefill, as in Sarathi-Serve and vLLM), then their first tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from service.engine.cache.appended import KVCache
from service.engine.cache.in_place import InPlaceDecoder
from service.engine.sequence import Emit, Sequence

if TYPE_CHECKING:
    from service.engine.tasks.generation.decoding import GenerationBatch, GenerationModel, _Row


def release_slots(rows: list[_Row]) -> None:
    """Free the in-place cache slots of rows that are done (finished, cancelled, or failed)."""
    for row in rows:
        if row.hold is not None:
            row.hold.release()


class PromptBatch:
    """Newcomers whose left-padded prompts are fed to the graph a chunk of columns per call (chunked
    prefill, as in Sarathi-Serve and vLLM): while a batch decodes, each of its steps then waits for one
    bounded chunk instead of for whole prompts. Every chunk attends to the cache of the ones before it,
    so the last chunk's logits are those of one whole-prompt call."""

    def __init__(self, model: GenerationModel, rows: list[_Row]) -> None:
        self.model = model
        self.rows = rows
        B, S = len(rows), max(len(r.seq.prompt_ids) for r in rows)
        self.ids = np.full((B, S), model.pad, dtype=np.int64)
        self.mask = np.zeros((B, S), dtype=np.int64)
        for b, row in enumerate(rows):  # left padding: every prompt ends in the last column
            n = len(row.seq.prompt_ids)
            self.ids[b, S - n :] = row.seq.prompt_ids
            self.mask[b, S - n :] = 1
        self.cache = KVCache.empty(B, model.n_layers, model.artifact.n_kv_heads, model.artifact.d_head)
        self.fed = 0  # columns already in the cache
        # Attention maps are cut from one whole-prompt call: such a batch is never split.
        self.attention = any(r.params.return_attention for r in rows)

    @property
    def sequences(self) -> list[Sequence]:
        return [r.seq for r in self.rows]

    def advance(self, max_tokens: int | None) -> tuple[list[Emit], GenerationBatch | None] | None:
        """Feed the next chunk, at most `max_tokens` padded tokens (at least one column; None: all the
        rest). None while columns remain; after the last, the first tokens and the decode batch."""
        B, S = self.ids.shape
        width = S - self.fed
        if max_tokens is not None and not self.attention:
            width = min(width, max(1, max_tokens // B))
        columns = slice(self.fed, self.fed + width)
        ids, mask = self.ids[:, columns], self.mask[:, columns]
        logits, self.cache, attn = self.model.run(ids, self.cache, mask, self.attention)
        self.fed += width
        if self.fed < S:
            return None
        return self.model.first_tokens(self.rows, logits, self.cache, attn, S)


class SlotPrompts:
    """Newcomers' prompts fed into their own cache slots (cache/in_place.py), one row after another, at most
    `max_tokens` tokens per call: no padding, and a prompt starts from its longest cached prefix."""

    def __init__(self, model: GenerationModel, decoder: InPlaceDecoder, rows: list[_Row]) -> None:
        self.model, self.decoder, self.rows = model, decoder, rows
        for row in rows:
            row.hold = decoder.begin(row)
        self.logits: list[np.ndarray] = []  # the last prompt position's, of the rows done
        self.started = 0  # rows whose feeding began (their cached prefix looked up)

    @property
    def sequences(self) -> list[Sequence]:
        return [r.seq for r in self.rows]

    def advance(self, max_tokens: int | None) -> tuple[list[Emit], GenerationBatch | None] | None:
        budget = max_tokens if max_tokens is not None else sum(len(r.seq.prompt_ids) for r in self.rows)
        try:
            while len(self.logits) < len(self.rows) and budget > 0:
                budget -= self._feed(self.rows[len(self.logits)], budget)
        except BaseException:
            release_slots(self.rows)  # the worker retries the prompts as new rows
            raise
        if len(self.logits) < len(self.rows):
            return None
        return self.model.first_tokens(self.rows, np.stack(self.logits), None, [], 0)

    def _feed(self, row: _Row, budget: int) -> int:
        """The row's next chunk, at most `budget` tokens; the tokens fed."""
        assert row.hold is not None
        prompt = row.seq.prompt_ids
        if self.started == len(self.logits):  # this row's first chunk
            self.decoder.reuse_prefix(row.hold.slot, prompt)
            self.started += 1
        width = min(len(prompt) - int(self.decoder.buffers.lengths[row.hold.slot]), budget)
        logits = self.decoder.feed(row.hold.slot, prompt, width)
        if self.decoder.buffers.lengths[row.hold.slot] == len(prompt):
            self.logits.append(logits)
        return width
