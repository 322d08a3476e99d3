"""Each HTTP request's lease on the server-wide attention budget (service/engine/budget.py): opened when the
request arrives, given back once its response (stream included) has been sent or has failed, so what a
request reserved counts until the bytes have left the server. When the budget is idle again, the heap the
maps used goes back to the OS (service/api/asgi/heap.py)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.asgi.base import HttpMiddleware
from service.api.asgi.heap import HeapTrimmer
from service.engine.budget import Budget, leased


class BudgetMiddleware(HttpMiddleware):
    def __init__(self, app: ASGIApp, budget: Budget) -> None:
        super().__init__(app)
        self.budget = budget
        self.trimmer = HeapTrimmer()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with leased(self.budget) as lease:
                await self.app(scope, receive, send)
        finally:
            if lease.reserved and not self.budget.held:  # the last maps of a burst are garbage now
                self.trimmer.soon()
