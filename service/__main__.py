"""`python -m service`: read the settings, serve on SERVE_HOST:SERVE_PORT, drain on SIGTERM/SIGINT.

Draining: the first signal turns /ready and new inference requests to 503 while in-flight requests
finish. SERVE_DRAIN_TIMEOUT_S bounds the whole shutdown: shortly before it runs out, the requests still
running are cut (a stream gets a final `error` event, or an error chunk and `[DONE]` on the OpenAI route;
a waiting request gets 503); shortly before it ends, the connections still open (a client that does not
read its answer, or still sends its body) are aborted, and the process exits. A second signal stops at once.

SERVE_API_PROCESSES=N (N > 1) runs the HTTP front end in N processes forked from this one, which keeps the
models and runs them (service/multiprocess/launch.py); requests, streams, drain and exit statuses are
the same.

The models are loaded before uvicorn starts: a broken or mismatched artifact stops the process with one
line naming the file, and exit status 1.
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

from service.app import create_app
from service.engine.engine import Engine
from service.engine.metrics import Metrics, share_metrics_between_processes
from service.logs import configure_logging
from service.multiprocess.launch import serve_processes
from service.runtime.artifact import ArtifactError
from service.server import DrainingServer, server_config
from service.settings import Settings


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
    if settings.api_processes > 1:
        share_metrics_between_processes()
    engine = Engine(settings, Metrics())
    try:
        engine.load()
    except ArtifactError as exc:
        print(f"cannot serve: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    app = create_app(settings, engine)
    config = server_config(app, settings, log_config=log_config)
    if settings.api_processes > 1:
        raise SystemExit(serve_processes(app, engine, config, settings))
    server = DrainingServer(config, app, settings.drain_timeout_s)
    server.run()
    if not server.started:
        raise SystemExit(3)  # uvicorn's own status for a failed start-up (port in use, ...)


if __name__ == "__main__":
    main()
