"""The app factory: `service.app:create_app`. The engine is built in the lifespan, never at import time."""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.api.asgi.auth import ApiKeyMiddleware
from service.api.asgi.budget import BudgetMiddleware
from service.api.asgi.middleware import BodyLimitMiddleware, InFlight, InternalErrorMiddleware, RequestMetricsMiddleware
from service.api.asgi.security_headers import SecurityHeadersMiddleware
from service.api.asgi.tracing import RequestContextMiddleware
from service.api.docs.openapi import ServingApp, description
from service.api.docs.pages import install_docs
from service.api.docs.playground import install_playground
from service.api.errors import install_error_handlers
from service.api.hf import routes as hf
from service.api.native import health
from service.api.native.metrics import router as metrics_router
from service.api.native.schemas import ErrorResponse
from service.api.openai import chat, completions, models
from service.api.openai.errors import OpenAIErrorMiddleware
from service.api.routes import add_routes
from service.api.tei import routes as tei
from service.api.tgi import routes as tgi
from service.api.tokenizer import routes as tokenizer
from service.engine.budget import Budget
from service.engine.engine import Engine
from service.engine.metrics import Metrics
from service.engine.registry import records
from service.settings import Settings

log = logging.getLogger(__name__)

# 404: the route's model is not in SERVE_MODELS (or an unknown model name): a fact of this server's
# configuration, not a passing state, so not 503 (which load balancers and clients retry); 500: a failed run.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 408, 413, 422, 429, 500, 503, 504)
}


async def warm_up(engine: Engine, enabled: bool) -> None:
    if enabled or engine.remote is not None:  # a front end always waits for the engine process's warm-up
        try:
            await engine.warmup()
        except Exception as exc:
            if engine.remote is not None:  # the engine process failed to warm up, or is gone: it says why
                engine.failure = engine.remote.failure or str(exc)
            else:
                log.exception("warm-up failed")
                engine.failure = f"warm-up failed: {exc}"
            return
    # What start-up built (the app, schemas, sessions, tokenizers: ~80k objects) lives as long as the
    # process: move it out of the collector's sight (before the first request: the collect takes ~50 ms),
    # or each full collection scans it while streams wait. Measured at 16 streams: one 65-70 ms pause in
    # 3 s; frozen, the longest inter-token gap fell from 73-83 ms to 27-29 ms.
    gc.collect()
    gc.freeze()
    engine.ready = True


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """`engine`: one already loaded (python -m service loads before serving, to fail fast); else the
    lifespan builds and loads it."""
    settings = settings or Settings()
    metrics = engine.metrics if engine is not None else Metrics()
    loaded = engine

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = loaded
        if engine is None:
            engine = Engine(settings, metrics)
            await asyncio.to_thread(engine.load)
        await engine.start()
        engine.share_tokenizer_work(tokenizer.tokenizer_slots(app))  # long prompts: the slots /tokenize uses
        app.state.engine = engine
        # Serve /health at once; /ready turns 200 when warm-up is done.
        warm = asyncio.create_task(warm_up(engine, settings.warmup), name="warm-up")
        try:
            yield
        finally:
            warm.cancel()
            await asyncio.gather(warm, return_exceptions=True)
            await engine.stop()

    app = ServingApp(
        title="transformer-serving",
        version="0.1.0",
        description=description(engine),
        lifespan=lifespan,
        docs_url=None,  # served offline by install_docs
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.inflight = InFlight()
    install_error_handlers(app)
    _add_middleware(app, settings, metrics)
    # Routes match in order, a few microseconds a check in FastAPI: the inference routes come first, each
    # registered task's own (service/engine/registry.py), then the protocols'.
    tasks = [importlib.import_module(task.route_module) for task in records().values()]
    for module in dict.fromkeys([*tasks, completions, chat, tei, tgi, hf, models, tokenizer]):
        add_routes(app, module.router, tei.TEI_ERRORS if module is tei else ERRORS)
    add_routes(app, health.router)
    add_routes(app, metrics_router)
    install_docs(app)
    install_playground(app)
    return app


def _add_middleware(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    # Outermost last: 500s -> metrics and drain refusal -> API key (before any body is read) -> body limit
    # -> the request's lease on the attention budget (given back once the response is sent).
    attention_budget = Budget(settings.max_attention_values_in_flight, "SERVE_MAX_ATTENTION_VALUES_IN_FLIGHT")
    app.state.attention_budget = attention_budget
    app.add_middleware(BudgetMiddleware, budget=attention_budget)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    app.add_middleware(ApiKeyMiddleware, key=settings.api_key, public_docs=settings.public_docs)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, inflight=app.state.inflight)
    app.add_middleware(InternalErrorMiddleware)
    # Client compatibility (outside the above): OpenAI and TEI error bodies, request ids and timing headers, CORS.
    app.add_middleware(OpenAIErrorMiddleware)
    app.add_middleware(tei.TeiErrorMiddleware)
    app.add_middleware(RequestContextMiddleware)
    if settings.cors_origins:  # outermost: a preflight is answered before the API key is asked for
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "x-queue-time", "x-inference-time", "x-total-time", "retry-after"],
        )
    app.add_middleware(SecurityHeadersMiddleware)  # outermost of all: every response carries them


def begin_drain(app: FastAPI) -> None:
    """Stop taking inference requests (503) and report not ready; in-flight requests carry on."""
    engine: Engine | None = getattr(app.state, "engine", None)
    if engine is not None:
        engine.draining = True


async def cut_off(app: FastAPI) -> None:
    """End every request still running at the drain timeout: the engine fails their sequences, so streams
    send their final error event and waiting requests answer 503."""
    engine: Engine | None = getattr(app.state, "engine", None)
    if engine is not None:
        await engine.stop("the server is shutting down: the request was cut off at the drain timeout")


def inflight(app: FastAPI) -> int:
    count: int = app.state.inflight.count
    return count
