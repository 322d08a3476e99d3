"""SERVE_API_PROCESSES=N (N > 1): the HTTP front end in N processes, the models in one engine process.

One process does everything by default: HTTP parsing, validation, tokenizing and rendering answers share
one interpreter lock with the models' decode loops, so on a machine with a fast accelerator and many cores
that Python front end, not the model, sets the throughput (vLLM splits its API server from its engine core
for the same reason). Here:

- `python -m service` loads the models, binds the port, and forks N front-end processes (as gunicorn's
  --preload does): each gets a copy of the loaded engine, with its sessions detached, and serves HTTP on
  a listening socket of its own on that port (SO_REUSEPORT); the kernel spreads connections between them.
- This process stays the engine: it runs the models' schedulers, warms up, and serves each front end's
  socket pair (service/multiprocess/core.py). A front end turns ready when the engine is warm.
- Signals: SIGTERM or SIGINT here is passed on to every front end as SIGTERM, so each drains as one
  process does (new requests 503, in-flight ones finish, cut at SERVE_DRAIN_TIMEOUT_S); a second signal
  stops them at once. When they have all exited the engine stops, with exit status 0.
- A front end that exits on its own is a failure: the others are stopped and the exit status is 1 (the
  orchestrator restarts the whole server). A front end whose engine process is gone fails its requests
  with 503 and exits.

Metrics are shared through prometheus_client's multiprocess files (service/engine/metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys

import uvicorn
from fastapi import FastAPI

from service.app import warm_up
from service.engine.engine import Engine
from service.multiprocess.core import FrontEnd
from service.multiprocess.front import GONE, attach_front
from service.server import DrainingServer
from service.settings import Settings

log = logging.getLogger("service")

STARTUP_FAILURE = 3  # uvicorn's exit status for a failed start-up (port in use, ...)
# After the drain timeout, how long the front ends get to exit before they are killed.
EXIT_GRACE_S = 5.0


def serve_processes(app: FastAPI, engine: Engine, config: uvicorn.Config, settings: Settings) -> int:
    """Fork the front ends, then run the engine in this process until they have exited; the exit status."""
    try:
        listeners = bind_listeners(settings.host, settings.port, settings.api_processes)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc)
        return STARTUP_FAILURE
    log.info("listening on http://%s:%d with %d front-end processes", settings.host, settings.port, len(listeners))
    pairs = [socket.socketpair() for _ in listeners]
    fronts: list[tuple[int, socket.socket]] = []
    for listener, (here, there) in zip(listeners, pairs, strict=True):
        pid = os.fork()
        if pid == 0:  # a front end: never returns
            for other in [*listeners, *(end for pair in pairs for end in pair)]:
                if other is not listener and other is not there:
                    other.close()
            _exit_front(app, engine, config, settings, listener, there)
        there.close()
        fronts.append((pid, here))
    for listener in listeners:
        listener.close()  # the front ends accept; this process only runs the models
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # uvloop, as the front ends
        return runner.run(_run_engine(engine, fronts, settings))


def bind_listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """One listening socket per front end, all on host:port (SO_REUSEPORT): the kernel spreads new
    connections evenly between them. (One shared socket lets whichever process wakes first accept a whole
    burst: measured with 32 clients, one front end got 3 times the other's.) The port is first bound
    without SO_REUSEPORT, so one already in use fails here, as in one process, rather than being shared."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
    listeners = []
    for _ in range(count):
        sock = socket.socket(family)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
        listeners.append(sock)
    return listeners


def _exit_front(
    app: FastAPI,
    engine: Engine,
    config: uvicorn.Config,
    settings: Settings,
    listener: socket.socket,
    link: socket.socket,
) -> None:
    """Serve HTTP as a front end until drained, then exit the process."""
    status = 1
    try:
        # The tokenizers' thread pool did not survive the fork: long texts are tokenized on one thread.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        server = DrainingServer(config, app, settings.drain_timeout_s, interrupts=False)

        def engine_gone() -> None:  # its requests have failed with 503: drain, which ends at once
            engine.failure = GONE
            server.handle_exit(signal.SIGTERM, None)

        attach_front(engine, link, engine_gone)
        server.run(sockets=[listener])
        status = 0 if server.started else STARTUP_FAILURE
    except SystemExit as exc:  # uvicorn's own exit (a failed start-up)
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("front-end process %d failed", os.getpid())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # not the engine's atexit handlers (they belong to the process that forked)


async def _run_engine(engine: Engine, pids_and_links: list[tuple[int, socket.socket]], settings: Settings) -> int:
    await engine.start()
    fronts = [FrontEnd(engine, pid) for pid, _ in pids_and_links]
    for front, (_, sock) in zip(fronts, pids_and_links, strict=True):
        await front.connect(sock)
        front.state()
    loop = asyncio.get_running_loop()
    signals: list[int] = []

    def forward(sig: int) -> None:
        signals.append(sig)
        log.info("signal %d: %s the front ends", sig, "draining" if len(signals) == 1 else "stopping")
        for front in fronts:
            with contextlib.suppress(ProcessLookupError):
                os.kill(front.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, forward, sig)

    async def warm() -> None:
        await warm_up(engine, settings.warmup)
        for front in fronts:
            front.state()

    warming = asyncio.create_task(warm(), name="warm-up")
    gone = [front.gone for front in fronts if front.gone is not None]
    await asyncio.wait(gone, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if not signals:
        log.error("a front-end process exited unexpectedly: stopping the server")
        status = 1
        forward(signal.SIGTERM)
    _, alive = await asyncio.wait(gone, timeout=settings.drain_timeout_s + EXIT_GRACE_S)
    if alive:
        log.error("%d front-end process(es) still running after the drain: killing them", len(alive))
        for front in fronts:
            with contextlib.suppress(ProcessLookupError):
                os.kill(front.pid, signal.SIGKILL)
    for front in fronts:
        _, code = await asyncio.to_thread(os.waitpid, front.pid, 0)
        if os.waitstatus_to_exitcode(code) == STARTUP_FAILURE:
            status = STARTUP_FAILURE
    warming.cancel()
    await asyncio.gather(warming, return_exceptions=True)
    await engine.stop()
    return status
