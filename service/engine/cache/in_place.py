"""Running a decoder graph whose cache is written in place (service/engine/cache/slots.py): a prompt's chunks into
its own slot, and decode steps over the slots in use.

Rows are right aligned in their slots: a row's tokens are positions 0 .. length - 1 of its slot, and the
attention mask tells the graph each row's total length (past + new) as leading ones. A decode step runs
every slot up to the high-water mark: a slot that holds no decoding row (free, or a prompt half fed)
gets a pad token written at its own length, where the next chunk of that prompt writes over it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.names import ATTENTION_MASK, INPUT_IDS, POSITION_IDS
from service.engine.cache.budget import kv_cache_budget
from service.engine.cache.prefix import BLOCK, PrefixCache
from service.engine.cache.slots import SlotBuffers, SlotHold, bytes_per_token
from service.engine.metrics import Metrics
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession
from service.settings import Settings


def _leading_ones(lengths: np.ndarray) -> np.ndarray:
    """[B, max(lengths)] int64 masks with each row's first `length` entries 1."""
    return (np.arange(int(lengths.max())) < lengths[:, None]).astype(np.int64)


class InPlaceDecoder:
    """One generator's slots, prefix store and graph calls; used by its worker thread only."""

    def __init__(
        self,
        session: GraphSession,
        artifact: Artifact,
        slots: int,
        budget: int,
        prefix_share: float,
        prefix_counters: tuple[Any, Any] | None = None,
        longest: int | None = None,
    ) -> None:
        self.session = session
        self.prefix_counters = prefix_counters  # prompt tokens looked up and found (Prometheus children)
        self.pad = artifact.special_tokens["pad"]
        self._shape = (artifact.n_decoder_layers, artifact.n_kv_heads, artifact.d_head)
        # A slot holds the longest sequence a request may make (prompt + new tokens, within the context): the
        # attention kernel's scratch space for a prompt grows with the buffers' length, not the prompt's.
        self._slots, self._capacity = slots, min(artifact.max_positions, longest or artifact.max_positions)
        self._buffers: SlotBuffers | None = None
        self.budget = budget
        self.bytes_per_token = bytes_per_token(*self._shape)
        prefix_bytes = int(budget * prefix_share)
        block_bytes = BLOCK * self.bytes_per_token
        self.prefixes = PrefixCache(prefix_bytes, block_bytes) if prefix_bytes >= block_bytes else None

    @classmethod
    def for_session(
        cls, name: str, session: GraphSession, artifact: Artifact, settings: Settings, metrics: Metrics
    ) -> InPlaceDecoder | None:
        """The decoder a generator's graph needs when it writes its cache in place (None: it appends to it),
        sized by the settings: a slot per batch row, each as long as a request may make a sequence."""
        if not session.spec.writes_cache_in_place:
            return None
        return cls(
            session,
            artifact,
            settings.max_batch_size,
            kv_cache_budget(settings.kv_cache_bytes),
            settings.prefix_cache_fraction,
            (metrics.prefix_cache_queries.labels(name), metrics.prefix_cache_hits.labels(name)),
            longest=settings.max_input_tokens + settings.max_new_tokens,
        )

    @property
    def buffers(self) -> SlotBuffers:
        """Mapped on first use, in the engine process's worker (a forked front end never maps them)."""
        if self._buffers is None:
            self._buffers = SlotBuffers(*self._shape, self._slots, self._capacity)
        return self._buffers

    @property
    def cached_bytes(self) -> int:
        """Bytes of keys and values held now: the slots' tokens and the prefix store."""
        held = self._buffers.cached_tokens * self.bytes_per_token if self._buffers is not None else 0
        return held + (self.prefixes.bytes if self.prefixes is not None else 0)

    def begin(self, owner: object) -> SlotHold:
        """A slot for a new sequence (released when `owner` is collected, if not before)."""
        return SlotHold.take(owner, self.buffers)

    def reuse_prefix(self, slot: int, prompt: list[int]) -> int:
        """Copy the prompt's longest cached prefix into its empty slot; the tokens reused. Called as the prompt's
        turn to be fed comes, so a prompt fed just before it (another choice of the request, a burst of requests
        with one system prompt) is already in the store."""
        if self.prefixes is None:
            return 0
        found = self.prefixes.reuse(prompt, slot, self.buffers)
        if self.prefix_counters is not None:
            queries, hits = self.prefix_counters
            queries.inc(len(prompt))
            hits.inc(found)
        return found

    def feed(self, slot: int, prompt: list[int], width: int) -> np.ndarray:
        """The prompt's next `width` tokens into its slot; the last position's logits [V]."""
        buffers = self.buffers
        fed = int(buffers.lengths[slot])
        ids = np.asarray([prompt[fed : fed + width]], dtype=np.int64)
        positions = np.arange(fed, fed + width, dtype=np.int64)[None]
        mask = np.ones((1, fed + width), dtype=np.int64)
        logits = self._run(ids, mask, positions, slot, slot + 1)
        buffers.lengths[slot] = fed + width
        if fed + width == len(prompt) and self.prefixes is not None:
            self.prefixes.remember(prompt, slot, buffers)
        last: np.ndarray = logits[0]
        return last

    def step(self, slots: np.ndarray, next_ids: np.ndarray) -> np.ndarray:
        """One token per decoding row (`slots[i]` feeds `next_ids[i]`); their logits [B, V]."""
        buffers = self.buffers
        n = int(slots.max()) + 1
        lengths = buffers.lengths[:n]
        ids = np.full((n, 1), self.pad, dtype=np.int64)
        ids[slots, 0] = next_ids
        positions = np.zeros((n, 1), dtype=np.int64)
        positions[slots, 0] = lengths[slots]
        logits = self._run(ids, _leading_ones(lengths + 1), positions, 0, n)
        buffers.lengths[slots] += 1
        chosen: np.ndarray = logits[slots]
        return chosen

    def _run(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, first: int, stop: int) -> np.ndarray:
        buffers = self.buffers
        views = buffers.views(first, stop)
        cache = dict(zip(buffers.past_names, zip(buffers.present_names, views, strict=True), strict=True))
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: positions, **self.session.last_logits_only}
        logits: np.ndarray = self.session.run_in_place(feeds, ["logits"], cache)["logits"]
        return logits[:, -1]

    def room(self, reserved: int, wanted: int) -> int:
        """Bytes of the budget free beside `reserved` (the running sequences' worst case) and the prefix store,
        after the store gives back up to `wanted` bytes."""
        store = self.prefixes.bytes if self.prefixes is not None else 0
        free = self.budget - reserved - store
        if free < wanted and self.prefixes is not None:
            free += self.prefixes.evict(wanted - free)
        return free
