"""What a task service queues its sequences on: the model's `Scheduler` in this process, or, in a front-end
process (SERVE_API_PROCESSES > 1), a `RemoteScheduler` whose model runs in the engine process
(service/multiprocess/front.py). Both take all of a request's sequences or none, and answer through a
`Handle` on the event loop."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar, overload

from service.engine.errors import EngineError
from service.engine.handle import Handle
from service.engine.sequence import SeqT, Sequence

H = TypeVar("H", bound=Handle[Any, Any])


class SequenceQueue(ABC, Generic[SeqT]):
    """`submit` makes the request's handle (of the type the service asks for) the same way for both;
    each queue says what refuses a request before that (`_check`) and where its sequences go (`_enqueue`)."""

    name: str

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    async def stop(self, error: EngineError) -> None:
        """Fail everything queued or running with `error` (idempotent)."""

    @overload
    def submit(self, sequences: list[SeqT], deadline: float | None, field: str) -> Handle[Any, Any]: ...

    @overload
    def submit(self, sequences: list[SeqT], deadline: float | None, field: str, kind: type[H]) -> H: ...

    def submit(
        self, sequences: list[SeqT], deadline: float | None, field: str, kind: type[Handle[Any, Any]] = Handle
    ) -> Handle[Any, Any]:
        """Queue all sequences or none; `field` names the request field that makes many (texts, prompts,
        choices) in the 422 for more than the queue could ever hold."""
        self._check(sequences, field)
        handle = kind(self.name, list(sequences), deadline, self.cancel)
        self._enqueue(sequences, handle, field)
        return handle

    def _check(self, sequences: list[SeqT], field: str) -> None:
        """Refuse a request before its handle exists (by default nothing is refused here)."""

    @abstractmethod
    def _enqueue(self, sequences: list[SeqT], handle: Handle[Any, Any], field: str) -> None:
        """Queue the request's sequences (their handle made) or raise."""

    @abstractmethod
    def cancel(self, sequences: list[Sequence]) -> None: ...
