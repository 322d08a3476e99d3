"""A server-wide budget for what requests make the server hold at once (attention maps): each request
reserves its share before any work, or is refused with a 429 (retry later) while others hold the budget,
and gives it back when its response has been sent.

The API layer opens one `Lease` per HTTP request (service/api/asgi/budget.py) and makes it current; the engine's
checks reserve from the current lease (`reserve`). With no lease (the engine driven directly: warm-up,
tests) nothing is counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from service.engine.errors import QueueFull


class Budget:
    """`capacity` units (attention numbers) shared by every request in flight."""

    def __init__(self, capacity: int, setting: str) -> None:
        self.capacity = capacity
        self.setting = setting  # named in the refusal, so an operator knows what to raise
        self.held = 0
        self._lock = threading.Lock()  # reserved on the event loop, released there too; cheap insurance

    def take(self, amount: int) -> bool:
        with self._lock:
            if self.held + amount > self.capacity:
                return False
            self.held += amount
            return True

    def give_back(self, amount: int) -> None:
        with self._lock:
            self.held -= amount


class Lease:
    """What one request holds of a budget; `release` gives it all back (once)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.held = 0
        self.reserved = 0  # all it ever reserved

    def reserve(self, amount: int, field: str) -> None:
        if not self.budget.take(amount):
            raise QueueFull(
                f"the server holds too many attention maps for other requests right now ({self.budget.held:,} of "
                f"{self.budget.capacity:,} numbers, {self.budget.setting}); this request needs {amount:,}: retry",
                retry_after_s=1,
                field=field,
            )
        self.held += amount
        self.reserved += amount

    def release(self) -> None:
        self.budget.give_back(self.held)
        self.held = 0


_current: ContextVar[Lease | None] = ContextVar("budget_lease", default=None)


@contextmanager
def leased(budget: Budget) -> Iterator[Lease]:
    """Make a new lease on `budget` current for the block (one request); release it when the block ends."""
    lease = Lease(budget)
    token = _current.set(lease)
    try:
        yield lease
    finally:
        _current.reset(token)
        lease.release()


def reserve(amount: int, field: str) -> None:
    """Reserve `amount` from the current request's lease: QueueFull (429, Retry-After) if the budget is spent."""
    lease = _current.get()
    if lease is not None:
        lease.reserve(amount, field)
