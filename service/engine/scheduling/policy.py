"""The scheduling policy: who may queue, how long a burst waits for company, and who joins the batch next.

Pure code over a queue and a clock (no threads, no locks, no sleeps): the worker (worker.py) calls it
under its lock and carries out what it decides, and tests drive it with a fake clock. vLLM's scheduler
has the same split: the policy returns a plan, the loop executes it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic

from service.engine.errors import InvalidInput, QueueFull
from service.engine.sequence import SeqT, Sequence

# Padded prompt tokens (B * S) per prefill call: prompt scoring computes logits at every position, and
# older generator graphs do for prefill too. While other sequences are decoding, a group of newcomers gets
# the smaller budget (one longest prompt of the committed generator, 255 tokens), so a burst of long
# prompts joins in several groups (each fed in chunks where the model can) rather than all at once.
MAX_PREFILL_TOKENS = 4096
STEP_PREFILL_TOKENS = 256


class SchedulingPolicy(Generic[SeqT]):
    """Admission (all of a request or none), batching waits and first-come-first-served admission within
    the free batch rows and the prefill token budget."""

    def __init__(
        self,
        name: str,
        *,
        max_rows: int,
        max_queue_size: int,
        max_wait_s: float,
        clock: Callable[[], float] = time.perf_counter,
        cache_budget: int | None = None,
        cache_cost: Callable[[Sequence], int] = lambda seq: 0,
    ) -> None:
        self.name = name
        self.cache_budget = cache_budget  # bytes of key/value cache the running sequences may reserve
        self.cache_cost = cache_cost  # what one reserves (its worst case)
        self.max_rows = max_rows
        self.max_queue_size = max_queue_size
        self.max_wait_s = max_wait_s
        self.clock = clock
        self.waiting: deque[SeqT] = deque()

    def check_request(self, sequences: list[SeqT], field: str) -> None:
        """A request that could never run is a 422, whatever the queue holds; `field` names the request
        field that makes many (texts, prompts, choices)."""
        if len(sequences) > self.max_queue_size:
            raise InvalidInput(f"at most {self.max_queue_size} items per request (SERVE_MAX_QUEUE_SIZE)", field)
        for seq in sequences:
            if seq.rows > self.max_rows:
                raise InvalidInput(f"needs {seq.rows} batch rows but SERVE_MAX_BATCH_SIZE is {self.max_rows}")
            cost = self.cache_cost(seq)
            if self.cache_budget is not None and cost > self.cache_budget:
                raise InvalidInput(
                    f"its prompt and max_new_tokens need {cost} bytes of key/value cache, more than "
                    f"SERVE_KV_CACHE_BYTES ({self.cache_budget})",
                    "max_new_tokens",
                )

    def enqueue(self, sequences: list[SeqT]) -> None:
        """Queue all of them or none: a 429 the same way for one sequence and for many."""
        if len(self.waiting) + len(sequences) > self.max_queue_size:
            waiting = len(self.waiting)
            raise QueueFull(f"{self.name}: queue is full ({waiting} waiting, limit {self.max_queue_size})")
        now = self.clock()
        for seq in sequences:
            seq.enqueued = now
        self.waiting.extend(sequences)

    def drop(self, sequences: list[Sequence]) -> int:
        """Take cancelled sequences out of the queue; how many were waiting."""
        gone = {id(s) for s in sequences}
        kept = [s for s in self.waiting if id(s) not in gone]
        dropped = len(self.waiting) - len(kept)
        if dropped:
            self.waiting = deque(kept)
        return dropped

    def company_wait(self, idle: bool) -> float:
        """Seconds to wait for more arrivals before admitting (<= 0: admit now). Batching waits only when
        there is something to wait for: a lone arrival at an idle model runs at once (nobody else is coming
        yet), and a running batch never waits (newcomers join at the next step). Several arrivals at an idle
        model are a burst: it gets max_wait_s from the oldest arrival to fill the batch, so it prefills as one."""
        if not idle or len(self.waiting) <= 1 or sum(s.rows for s in self.waiting) >= self.max_rows:
            return 0.0
        return self.waiting[0].enqueued + self.max_wait_s - self.clock()

    def admit(self, batch_rows: int | None, cache_room: int | None = None) -> list[SeqT]:
        """Move waiting sequences into the batch (``batch_rows``: the running batch's rows, None when
        nothing decodes) while their rows fit, first come first served, while the padded prefill stays
        within the step's token budget (a first one always fits), and while their caches' worst case fits in
        ``cache_room`` bytes (None: no cache budget). A sequence that does not fit waits, and so do those
        behind it: first come, first served."""
        free = self.max_rows - (batch_rows or 0)
        budget = MAX_PREFILL_TOKENS if batch_rows is None else STEP_PREFILL_TOKENS
        admitted: list[SeqT] = []
        longest = 0
        now = self.clock()
        while self.waiting and self.waiting[0].rows <= free:
            seq = self.waiting[0]
            if admitted and max(longest, seq.prefill_tokens) * (len(admitted) + 1) > budget:
                break
            if cache_room is not None:
                if self.cache_cost(seq) > cache_room:
                    break
                cache_room -= self.cache_cost(seq)
            self.waiting.popleft()
            longest = max(longest, seq.prefill_tokens)
            free -= seq.rows
            seq.admitted = now
            if seq.timing is not None:
                seq.timing.admit(seq.enqueued, now)
            admitted.append(seq)
        return admitted
