"""`python -m service`: read the settings, serve on SERVE_HOST:SERVE_PORT, drain on SIGTERM/SIGINT.

Draining: the first signal turns /ready and new inference requests to 503 while in-flight requests
finish. SERVE_DRAIN_TIMEOUT_S bounds the whole shutdown: shortly before it runs out, the requests still
running are cut (a stream gets a final `error` event, or an error chunk and `[DONE]` on the OpenAI route;
a waiting request gets 503), and uvicorn then has only a short grace to close the connections. A second
signal stops at once.

The models are loaded before uvicorn starts: a broken or mismatched artifact stops the process with one
line naming the file, and exit status 1.
"""

from __future__ import annotations

import logging
import sys
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from service.app import begin_drain, create_app, cut_off, inflight
from service.engine.engine import Engine
from service.engine.metrics import Metrics
from service.http_protocol import header_timeout_protocol
from service.runtime.artifact import ArtifactError
from service.logs import configure_logging
from service.settings import Settings

log = logging.getLogger("service")


# Kept from the drain timeout for cutting the last requests and letting their error events go out.
CUT_RESERVE_S = 1.0
# uvicorn's own wait for connections after the drain: they have ended by then, or are idle.
CLOSE_GRACE_S = 1


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_timeout_s = drain_timeout_s
        self.cut_at = max(0.0, drain_timeout_s - min(CUT_RESERVE_S, drain_timeout_s / 2))
        self.drain_started: float | None = None
        self.cut = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is not None:  # second signal: stop now
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
                log.warning("drain timeout (%.1fs): cutting %d request(s) off", self.drain_timeout_s, inflight(self.app))
                await cut_off(self.app)
            if inflight(self.app) == 0 or waited >= self.drain_timeout_s:
                if inflight(self.app):
                    log.warning("%d request(s) still open at the drain timeout", inflight(self.app))
                self.should_exit = True
        return await super().on_tick(counter)


def main() -> None:
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "\n".join(
            f"  SERVE_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" if e["loc"] else f"  {e['msg']}"
            for e in exc.errors()
        )
        print(f"invalid settings:\n{problems}", file=sys.stderr)
        raise SystemExit(2) from None
    log_config = configure_logging(settings.log_level, settings.log_format)
    engine = Engine(settings, Metrics())
    try:
        engine.load()
    except ArtifactError as exc:
        print(f"cannot serve: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    app = create_app(settings, engine)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config,
        http=header_timeout_protocol(settings.header_timeout_s),
        timeout_graceful_shutdown=CLOSE_GRACE_S,
    )
    server = DrainingServer(config, app, settings.drain_timeout_s)
    server.run()
    if not server.started:
        raise SystemExit(3)  # uvicorn's own status for a failed start-up (port in use, ...)


if __name__ == "__main__":
    main()
