"""The engine process's side (SERVE_API_PROCESSES > 1): it holds the models and their schedulers, and
serves each front end's link: a request's sequences go onto their model's scheduler with a `RelayHandle`,
whose events go back over the link instead of onto a queue of this process's event loop."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from service.engine.engine import Engine
from service.engine.errors import EngineError, InferenceFailed
from service.engine.handle import Handle
from service.engine.registry import as_service
from service.engine.sequence import Sequence
from service.engine.tasks.generation.service import GenerationService
from service.multiprocess.wire import CANCEL, EVENT, FAILED, SCORE, SCORED, STATE, SUBMIT, UNSCORE, Link, Message

log = logging.getLogger(__name__)


class RelayHandle(Handle[Any, Any]):
    """A request from a front end: the scheduler delivers its events here (on this process's loop), and
    they go to the front end, tagged with the front end's request id. The front end keeps the deadline."""

    front: FrontEnd
    request_id: int

    def relay(self, front: FrontEnd, request_id: int) -> None:
        self.front, self.request_id = front, request_id
        self._unreported = set(range(len(self.sequences)))  # sequences whose admission time is not sent yet

    def put(self, index: int, event: Any, final: bool) -> None:
        if self.request_id not in self.front.requests:  # cancelled by the front end: nobody reads it there
            return
        admitted = None
        if index in self._unreported:  # the first event: when the sequence left the queue, for x-queue-time
            self._unreported.discard(index)
            admitted = self.sequences[index].admitted
        self.front.send((EVENT, self.request_id, index, event, final, admitted))
        if final and all(seq.done for seq in self.sequences):
            self.front.requests.pop(self.request_id, None)

    def fail(self, error: EngineError) -> None:
        if self.front.requests.pop(self.request_id, None) is not None:  # once per request: the first error ends it
            self.front.send((FAILED, self.request_id, error))


class FrontEnd:
    """One front-end process, as the engine process sees it: its link, and its requests and scorings
    running here."""

    def __init__(self, engine: Engine, pid: int) -> None:
        self.engine = engine
        self.pid = pid
        self.link: Link | None = None
        self.requests: dict[int, RelayHandle] = {}
        self.scorings: dict[int, asyncio.Task[None]] = {}
        self.gone: asyncio.Future[None] | None = None

    async def connect(self, sock: socket.socket) -> None:
        self.gone = asyncio.get_running_loop().create_future()
        self.link = await Link.open(sock, self._receive, self._lost)

    def send(self, message: Message) -> None:
        if self.link is not None:
            self.link.send(message)

    def _receive(self, message: Message) -> None:
        tag = message[0]
        if tag == SUBMIT:
            self._submit(*message[1:])
        elif tag == CANCEL:
            handle = self.requests.pop(message[1], None)
            if handle is not None:
                handle.cancel()
        elif tag == SCORE:
            rid = message[1]
            self.scorings[rid] = asyncio.create_task(self._score(*message[1:]), name=f"score-{self.pid}-{rid}")
        elif tag == UNSCORE:
            task = self.scorings.pop(message[1], None)
            if task is not None:
                task.cancel()

    def _submit(self, rid: int, model: str, sequences: list[Sequence], field: str) -> None:
        try:
            service: Any = self.engine.services[model]  # its scheduler takes the sequences its front end built
            handle = service.scheduler.submit(sequences, None, field, RelayHandle)
        except EngineError as exc:
            self.send((FAILED, rid, exc))
            return
        handle.relay(self, rid)
        self.requests[rid] = handle

    async def _score(self, rid: int, model: str, prompts: list[list[int]], top_k: int, deadline: float | None) -> None:
        service = as_service(self.engine.services[model], GenerationService)
        assert service is not None  # front ends send scorings for generators only
        outcome: Any
        try:
            outcome = await service.scorer.score(prompts, top_k, deadline)
        except asyncio.CancelledError:
            return
        except EngineError as exc:  # 429 (too many scorings waiting), 504 (the deadline)
            outcome = exc
        except Exception:
            log.exception("%s: prompt scoring failed", model)
            outcome = InferenceFailed(f"{model}: inference failed (the server log has the details)")
        finally:
            self.scorings.pop(rid, None)
        self.send((SCORED, rid, outcome))

    def state(self) -> None:
        """Tell the front end whether the engine is warm (or failed)."""
        self.send((STATE, self.engine.ready, self.engine.failure))

    def _lost(self) -> None:
        """The front end exited: what it still had running here is of no use to anyone."""
        for handle in self.requests.values():
            handle.cancel()
        self.requests.clear()
        for task in self.scorings.values():
            task.cancel()
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)
