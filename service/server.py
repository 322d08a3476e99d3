"""The HTTP server: uvicorn with a drain on SIGTERM/SIGINT (service/__main__.py describes it), run
by `python -m service` in its one process or in each front-end process (SERVE_API_PROCESSES > 1)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from service.app import begin_drain, cut_off, inflight
from service.http_protocol import timeout_protocol
from service.settings import Settings

log = logging.getLogger("service")


# Kept from the drain timeout for cutting the last requests and letting their error events go out.
CUT_RESERVE_S = 1.0
# Kept from the drain timeout for uvicorn's own shutdown and the process exit: connections still open
# then are aborted (measured: 0.2-0.3 s from there to the exit, uvicorn's 0.1 s ticks and pause included).
EXIT_RESERVE_S = 0.3
# A shutdown that no drain started (uvicorn's own): how long open connections get before they are aborted.
CLOSE_GRACE_S = 1.0
# After the aborts, how long uvicorn waits for the requests' tasks (they end at once: a blocked send returns,
# a body read answers http.disconnect) before it cancels them ("Exception in ASGI application").
TASK_GRACE_S = 0.3


class DrainingServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float, interrupts: bool = True
    ) -> None:
        """`interrupts` false (a front-end process): SIGINT is ignored. Ctrl+C reaches every process of the
        terminal's group; the engine process passes it on as SIGTERM, once per signal it gets."""
        super().__init__(config)
        self.app = app
        self.interrupts = interrupts
        self.drain_timeout_s = drain_timeout_s
        self.cut_at = max(0.0, drain_timeout_s - min(CUT_RESERVE_S, drain_timeout_s / 2))
        self.close_at = max(0.0, drain_timeout_s - min(EXIT_RESERVE_S, drain_timeout_s / 4))
        self.drain_started: float | None = None
        self.cut = False
        self.stop_now = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT and not self.interrupts:
            return
        if self.drain_started is not None:  # second signal: stop now
            self.stop_now = True
            super().handle_exit(sig, frame)
            return
        # Runs in a signal handler: only flip flags here; on_tick (on the loop) does the rest.
        self.drain_started = time.monotonic()
        begin_drain(self.app)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            waited = time.monotonic() - self.drain_started
            if counter % 10 == 0:
                log.info("draining: %d request(s) in flight", inflight(self.app))
            if inflight(self.app) and waited >= self.cut_at and not self.cut:
                self.cut = True
                log.warning(
                    "drain timeout (%.1fs): cutting %d request(s) off", self.drain_timeout_s, inflight(self.app)
                )
                await cut_off(self.app)
            if inflight(self.app) == 0 or waited >= self.close_at:
                if inflight(self.app):
                    log.warning("%d request(s) still open at the drain timeout", inflight(self.app))
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn waits for every connection to close, then cancels the requests still running after
        timeout_graceful_shutdown (a traceback each). A client that does not read (its stream's send waits
        on a full socket buffer, or a finished answer sits unsent) or does not send (a body trickling in)
        holds its connection to that timeout, past the drain's. Here the connections still open at the
        drain's end are aborted first: that ends their requests (a send returns, a body read answers
        http.disconnect), so uvicorn finds nothing to wait for or to cancel."""
        for server in self.servers:
            server.close()  # no new connections (uvicorn's shutdown does it too)
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        if self.stop_now:
            close_by = time.monotonic()
        elif self.drain_started is not None:
            close_by = self.drain_started + self.close_at
        else:
            close_by = time.monotonic() + CLOSE_GRACE_S
        while self.server_state.connections and time.monotonic() < close_by:  # noqa: ASYNC110 (a set, no event)
            await asyncio.sleep(0.02)
        if self.server_state.connections:
            log.warning("closing %d connection(s) still open at shutdown", len(self.server_state.connections))
            for connection in list(self.server_state.connections):
                connection.transport.abort()
        await super().shutdown(sockets)


def server_config(app: FastAPI, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration from the settings; `options`: more of uvicorn.Config's, or others' values."""
    values: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "http": timeout_protocol(settings.header_timeout_s, settings.body_timeout_s, settings.send_timeout_s),
        "timeout_keep_alive": settings.keepalive_timeout_s,  # typed int, used as a call_later delay: any float
        "timeout_graceful_shutdown": TASK_GRACE_S,  # typed int, used as an asyncio.wait_for timeout: any float
    }
    return uvicorn.Config(app, **(values | options))
