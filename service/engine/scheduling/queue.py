"""What a task service queues its sequences on: the model's `Scheduler` in this process, or, in a front-end
process (SERVE_API_PROCESSES > 1), a `RemoteScheduler` whose model runs in the engine process
(service/multiprocess/front.py). Both take all of a request's sequences or none, and answer through a
`Handle` on the event loop."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, overload

from service.engine.errors import EngineError
from service.engine.handle import Handle
from service.engine.sequence import SeqT, Sequence

H = TypeVar("H", bound=Handle[Any, Any])


class SequenceQueue(Protocol[SeqT]):
    name: str

    def start(self) -> None: ...

    async def stop(self, error: EngineError) -> None:
        """Fail everything queued or running with `error` (idempotent)."""
        ...

    @overload
    def submit(self, sequences: list[SeqT], deadline: float | None, field: str) -> Handle[Any, Any]: ...

    @overload
    def submit(self, sequences: list[SeqT], deadline: float | None, field: str, kind: type[H]) -> H: ...

    def cancel(self, sequences: list[Sequence]) -> None: ...
