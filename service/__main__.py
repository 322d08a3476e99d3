"""`python -m service`: read the settings, serve on SERVE_HOST:SERVE_PORT, drain on SIGTERM/SIGINT.

Draining: the first signal turns /ready and new inference requests to 503 while in-flight requests
finish (up to SERVE_DRAIN_TIMEOUT_S); then uvicorn shuts down. A second signal stops at once.
"""

from __future__ import annotations

import logging
import sys
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from service.app import begin_drain, create_app, inflight
from service.settings import Settings

log = logging.getLogger("service")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_timeout_s = drain_timeout_s
        self.drain_started: float | None = None

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
            if inflight(self.app) == 0 or waited >= self.drain_timeout_s:
                if inflight(self.app):
                    log.warning("drain timeout (%.0fs): %d request(s) cut off", waited, inflight(self.app))
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
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
    )
    DrainingServer(config, app, settings.drain_timeout_s).run()


if __name__ == "__main__":
    main()
