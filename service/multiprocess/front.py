"""A front-end process's side (SERVE_API_PROCESSES > 1): the HTTP server, validation and tokenizing run
here as in one process; each model's queue is a `RemoteScheduler` that ships a request's sequences to the
engine process and feeds their events to the request's `Handle`, as the model's own `Scheduler` does.

The front end is forked from the loaded engine (service/multiprocess/launch.py), so its services, their
tokenizers and artifacts are the engine's; only their sessions are detached: models run in one place.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.engine.engine import Engine
from service.engine.errors import EngineError, Unavailable
from service.engine.handle import Handle
from service.engine.registry import as_service
from service.engine.scheduling.queue import SequenceQueue
from service.engine.sequence import Sequence
from service.engine.tasks.generation.scoring import TokenScore
from service.engine.tasks.generation.service import GenerationService
from service.multiprocess.wire import CANCEL, EVENT, FAILED, SCORE, SCORED, STATE, SUBMIT, UNSCORE, Link, Message

log = logging.getLogger(__name__)

GONE = "the engine process is gone"


@dataclass
class Pending:
    """A request whose sequences run in the engine process."""

    model: str
    handle: Handle[Any, Any]
    open: int  # sequences without their final event yet


class EngineLink:
    """This front end's connection to the engine process: the requests and scorings waiting on it, and the
    engine process's state (warm, failed)."""

    def __init__(self, sock: socket.socket, on_gone: Callable[[], None]) -> None:
        self.sock = sock
        self.on_gone = on_gone  # the engine process is gone: this front end should shut down
        self.link: Link | None = None
        self.requests: dict[int, Pending] = {}
        self.request_ids: dict[Handle[Any, Any], int] = {}
        self.scorings: dict[int, asyncio.Future[list[list[TokenScore]]]] = {}
        self.failure: str | None = None
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[None] | None = None

    async def connect(self) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        self.link = await Link.open(self.sock, self._receive, self._lost)

    async def wait_ready(self) -> None:
        """Until the engine process has warmed up; raises with its failure if it could not."""
        assert self._ready is not None, "connect() first"
        await asyncio.shield(self._ready)

    def _send(self, message: Message) -> None:
        if self.link is None:
            raise Unavailable("the server is starting: the engine process is not connected yet")
        self.link.send(message)

    # --- requests ----------------------------------------------------------------------------------------

    def submit(self, model: str, handle: Handle[Any, Any], field: str) -> None:
        if self.failure is not None:
            raise Unavailable(self.failure)
        rid = next(self._ids)
        self._send((SUBMIT, rid, model, handle.sequences, field))
        self.requests[rid] = Pending(model, handle, len(handle.sequences))
        self.request_ids[handle] = rid

    def cancel(self, handle: Handle[Any, Any]) -> None:
        rid = self.request_ids.get(handle)
        if rid is not None:
            self._forget(rid)
            self._send((CANCEL, rid))

    def fail(self, model: str | None, error: EngineError) -> None:
        """End the open requests (of `model`; None: all) with `error` here, and cancel them there."""
        for rid, pending in list(self.requests.items()):
            if model is None or pending.model == model:
                self._fail(rid, error)
                if self.link is not None:
                    self.link.send((CANCEL, rid))

    def _forget(self, rid: int) -> None:
        pending = self.requests.pop(rid, None)
        if pending is not None:
            del self.request_ids[pending.handle]

    def _fail(self, rid: int, error: EngineError) -> None:
        pending = self.requests.get(rid)
        if pending is None:
            return
        self._forget(rid)
        for seq in pending.handle.sequences:
            seq.done = True
        pending.handle.fail(error)

    # --- prompt scoring ----------------------------------------------------------------------------------

    async def score(
        self, model: str, prompts: list[list[int]], top_k: int, deadline: float | None
    ) -> list[list[TokenScore]]:
        if self.failure is not None:
            raise Unavailable(self.failure)
        rid = next(self._ids)
        future: asyncio.Future[list[list[TokenScore]]] = asyncio.get_running_loop().create_future()
        self.scorings[rid] = future
        self._send((SCORE, rid, model, prompts, top_k, deadline))
        try:
            return await future
        finally:
            if self.scorings.pop(rid, None) is not None and self.link is not None:
                self.link.send((UNSCORE, rid))  # left before the answer: the engine process drops it

    # --- what the engine process sends -------------------------------------------------------------------

    def _receive(self, message: Message) -> None:
        tag = message[0]
        if tag == EVENT:
            self._event(*message[1:])
        elif tag == FAILED:
            self._fail(message[1], message[2])
        elif tag == SCORED:
            future = self.scorings.pop(message[1], None)
            if future is not None and not future.done():
                outcome = message[2]
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        elif tag == STATE:
            self._state(message[1], message[2])

    def _event(self, rid: int, index: int, event: Any, final: bool, admitted: float | None) -> None:
        pending = self.requests.get(rid)
        if pending is None:  # cancelled here while the event was on its way
            return
        seq = pending.handle.sequences[index]
        if seq.done:
            return
        if admitted is not None and seq.timing is not None:
            seq.timing.admit(seq.enqueued, admitted)
        if final:
            seq.done = True
            pending.open -= 1
            if not pending.open:
                self._forget(rid)
        pending.handle.put(index, event, final)

    def _state(self, ready: bool, failure: str | None) -> None:
        self.failure = failure
        assert self._ready is not None
        if self._ready.done():
            return
        if failure is not None:
            self._ready.set_exception(Unavailable(failure))
        elif ready:
            self._ready.set_result(None)

    def _lost(self) -> None:
        log.error("%s: failing %d request(s) in flight", GONE, len(self.requests))
        self.failure = GONE
        self.fail(None, Unavailable(GONE))
        for future in self.scorings.values():
            if not future.done():
                future.set_exception(Unavailable(GONE))
        self.scorings.clear()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(Unavailable(GONE))
        self.on_gone()


class RemoteScheduler(SequenceQueue[Any]):
    """A model's queue in a front end: its sequences run in the engine process's scheduler. Refusals
    there (429 queue full, 422 more than the queue holds, 503 stopped) reach the handle as its first
    event, which every route awaits before it answers, so they get the same status as in one process."""

    def __init__(self, name: str, link: EngineLink) -> None:
        self.name = name
        self.link = link

    def start(self) -> None:
        pass  # the engine process runs the model's worker

    async def stop(self, error: EngineError) -> None:
        self.link.fail(self.name, error)

    def _enqueue(self, sequences: list[Any], handle: Handle[Any, Any], field: str) -> None:
        if sequences:
            self.link.submit(self.name, handle, field)

    def cancel(self, sequences: list[Sequence]) -> None:
        handles = {id(seq.handle): seq.handle for seq in sequences if seq.handle is not None}
        for handle in handles.values():
            self.link.cancel(handle)


class RemoteScorer:
    """The generator's prompt scoring, run by the engine process."""

    def __init__(self, name: str, link: EngineLink) -> None:
        self.name = name
        self.link = link

    async def score(self, prompts: list[list[int]], top_k: int, deadline: float | None) -> list[list[TokenScore]]:
        return await self.link.score(self.name, prompts, top_k, deadline)


def attach_front(engine: Engine, sock: socket.socket, on_gone: Callable[[], None]) -> EngineLink:
    """Turn a forked copy of the loaded engine into a front end's: its models' queues and scoring go to
    the engine process over `sock`, and its sessions refuse to run."""
    link = EngineLink(sock, on_gone)
    for service in engine.services.values():
        service.scheduler = RemoteScheduler(service.name, link)
        generator = as_service(service, GenerationService)
        if generator is not None:
            generator.scorer = RemoteScorer(service.name, link)
    for info in engine.models.values():
        for session in info.sessions.values():
            session.detach()
    engine.remote = link
    return link
