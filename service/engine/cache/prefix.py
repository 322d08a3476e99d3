"""Prompt prefixes' keys and values, kept after a prompt is processed and reused by later prompts that start
with the same tokens (a chat template's system prompt, a RAG preamble, few-shot examples).

Prompts are cut into blocks of BLOCK tokens; the blocks form a tree (a block's parent is the block before
it), each node keyed by its parent and its own tokens, so a node stands for one exact token prefix and a
lookup compares tokens, never hashes. A node holds its block's keys and values, copied out of the slot
that computed them. A new prompt copies its longest cached prefix (whole blocks, at least one token left
to compute) into its slot and computes the rest (vLLM's automatic prefix caching, at block granularity).
A prefix's keys and values do not depend on what follows it (causal attention), so a reused prefix
gives the tokens and logprobs the prompt would give computed whole. Least recently used leaves go first
when the store is full.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from service.engine.cache.slots import SlotBuffers

BLOCK = 32  # tokens per node: coarser blocks copy in fewer pieces, finer ones reuse more of a prompt
_ROOT = 0


@dataclass(eq=False)
class _Node:
    parent: int
    tokens: tuple[int, ...]
    parts: list[np.ndarray]  # per cache buffer: [Hkv, BLOCK, Dh]
    children: int = 0


@dataclass
class PrefixCache:
    max_bytes: int
    block_bytes: int  # BLOCK tokens' keys and values
    nodes: OrderedDict[int, _Node] = field(default_factory=OrderedDict)  # least recently used first
    _ids: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict)  # (parent, tokens) -> node
    _next_id: int = 1
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of them, found

    @property
    def bytes(self) -> int:
        return len(self.nodes) * self.block_bytes

    def _chain(self, prompt: list[int], blocks: int) -> list[int]:
        """The cached nodes of the prompt's first `blocks` blocks, as far as they are cached."""
        chain, parent = [], _ROOT
        for i in range(blocks):
            node = self._ids.get((parent, tuple(prompt[i * BLOCK : (i + 1) * BLOCK])))
            if node is None:
                break
            chain.append(node)
            parent = node
        return chain

    def reuse(self, prompt: list[int], slot: int, buffers: SlotBuffers) -> int:
        """Copy the prompt's longest cached prefix into `slot`; the number of tokens copied."""
        chain = self._chain(prompt, (len(prompt) - 1) // BLOCK)  # the last token is always computed
        self.queries += len(prompt)
        self.hits += len(chain) * BLOCK
        for node_id in reversed(chain):  # parents end up more recent than their children: leaves go first
            self.nodes.move_to_end(node_id)
        for i, node_id in enumerate(chain):
            node = self.nodes[node_id]
            for buffer, part in zip(buffers.buffers, node.parts, strict=True):
                buffer[slot, :, i * BLOCK : (i + 1) * BLOCK] = part
        buffers.lengths[slot] = len(chain) * BLOCK
        return len(chain) * BLOCK

    def remember(self, prompt: list[int], slot: int, buffers: SlotBuffers) -> None:
        """Keep the whole blocks of a prompt just computed in `slot` (those not cached yet)."""
        parent = _ROOT
        path: list[int] = []
        for i in range(len(prompt) // BLOCK):
            key = (parent, tuple(prompt[i * BLOCK : (i + 1) * BLOCK]))
            node_id = self._ids.get(key)
            if node_id is None:
                if not self._make_room(keep=path):
                    break
                parts = [buffer[slot, :, i * BLOCK : (i + 1) * BLOCK].copy() for buffer in buffers.buffers]
                node_id = self._add(key, parts)
            path.append(node_id)
            parent = node_id
        for node_id in reversed(path):
            self.nodes.move_to_end(node_id)

    def evict(self, nbytes: int) -> int:
        """Drop least recently used leaves until `nbytes` are freed (or nothing is left); bytes freed."""
        freed = 0
        while freed < nbytes and self._drop_oldest_leaf(keep=()):
            freed += self.block_bytes
        return freed

    def _add(self, key: tuple[int, tuple[int, ...]], parts: list[np.ndarray]) -> int:
        node_id, self._next_id = self._next_id, self._next_id + 1
        self.nodes[node_id] = _Node(key[0], key[1], parts)
        self._ids[key] = node_id
        if key[0] != _ROOT:
            self.nodes[key[0]].children += 1
        return node_id

    def _make_room(self, keep: list[int]) -> bool:
        """Room for one more block, evicting if need be; False when only `keep` (the path being stored) is left."""
        while self.bytes + self.block_bytes > self.max_bytes:
            if not self._drop_oldest_leaf(keep=keep):
                return False
        return True

    def _drop_oldest_leaf(self, keep: list[int] | tuple[()]) -> bool:
        for node_id, node in self.nodes.items():
            if node.children == 0 and node_id not in keep:
                del self.nodes[node_id]
                del self._ids[(node.parent, node.tokens)]
                if node.parent != _ROOT:
                    self.nodes[node.parent].children -= 1
                return True
        return False
