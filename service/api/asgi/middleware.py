"""Pure ASGI middleware (streaming-safe): request metrics and in-flight count, and the body's size and time limits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi.base import HttpMiddleware
from service.api.errors import error_response, internal_error_response, log_internal_error
from service.engine.metrics import Metrics

INFERENCE_PATHS = frozenset(
    {"/v1/translate", "/v1/generate", "/v1/completions", "/v1/chat/completions", "/v1/classify"}
)
# TGI / Inference API routes (service/api/hf/routes.py); POST /models/{name} is one too.
HF_INFERENCE_PATHS = frozenset({"/generate", "/generate_stream", "/"})
KNOWN_PATHS = INFERENCE_PATHS | HF_INFERENCE_PATHS | {
    "/v1/models", "/health", "/ready", "/metrics", "/docs", "/redoc", "/openapi.json", "/playground",
    "/tokenize", "/detokenize", "/tokenizer_info", "/info",
}  # fmt: skip


def endpoint_label(path: str) -> str:
    """The metrics label: known paths as they are, path parameters folded, anything else "other"."""
    if path in KNOWN_PATHS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    if path.startswith("/models/"):
        return "/models/{name}"
    return "other"


def is_inference(method: str, path: str) -> bool:
    """Counted in flight and refused while draining."""
    if path in INFERENCE_PATHS:
        return True
    return method == "POST" and (path in HF_INFERENCE_PATHS or path.startswith("/models/"))


class InFlight:
    """Inference requests being handled, streams included (drain waits for this to reach 0)."""

    def __init__(self) -> None:
        self.count = 0


class RequestMetricsMiddleware(HttpMiddleware):
    """Counts and times every request; refuses inference requests that arrive while draining (a request
    that arrived before the drain began is in flight and runs to the end)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, inflight: InFlight) -> None:
        super().__init__(app)
        self.metrics = metrics
        self.inflight = inflight
        # (endpoint, status) -> its counter and histogram children: `labels()` locks and builds a key per call
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        endpoint = endpoint_label(path)
        inference = is_inference(scope.get("method", ""), path)
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        if inference:
            self.inflight.count += 1
            self.metrics.inflight.inc()
        try:
            engine = getattr(scope["app"].state, "engine", None)
            if inference and engine is not None and engine.draining:
                refusal = error_response(
                    503, "unavailable", "the server is draining for shutdown", headers={"Retry-After": "5"}
                )
                await refusal(scope, receive, send_with_status)
            else:
                await self.app(scope, receive, send_with_status)
        finally:
            if inference:
                self.inflight.count -= 1
                self.metrics.inflight.dec()
            count, duration = self._children_of(endpoint, str(status))
            count.inc()
            duration.observe(time.perf_counter() - started)

    def _children_of(self, endpoint: str, status: str) -> tuple[Any, Any]:
        key = (endpoint, status)  # endpoint labels are a bounded set (endpoint_label), and so are statuses
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.metrics.requests.labels(*key),
                self.metrics.request_duration.labels(*key),
            )
        return children


class BodyLimitMiddleware(HttpMiddleware):
    """The request body's limits: at most `max_bytes` (SERVE_MAX_BODY_BYTES, else 413), and all of it
    within `timeout_s` of the request's start (SERVE_BODY_TIMEOUT_S, else 408 and the connection closed: a
    client that stalls mid-body would otherwise hold the connection and an in-flight slot for good).
    The whole body within one deadline, not a bound on the gap between chunks: one byte every few seconds
    would pass any gap bound, forever."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large()(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        received = 0
        body_done = False
        refusal: Response | None = None

        async def limited() -> Message:  # chunked bodies declare no length: count as they arrive
            nonlocal received, body_done, refusal
            if body_done:  # the disconnect watchers wait here for as long as the response takes
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    msg = await receive()
            except TimeoutError:
                refusal = self._too_slow()
                raise _BodyRefused from None
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.max_bytes:
                    refusal = self._too_large()
                    raise _BodyRefused
                body_done = not msg.get("more_body", False)
            return msg

        async def unless_refused(msg: Message) -> None:
            if refusal is None:  # FastAPI answers a failed body read itself (400): replace that with ours
                await send(msg)

        with contextlib.suppress(_BodyRefused):
            await self.app(scope, limited, unless_refused)
        if refusal is not None:
            await refusal(scope, receive, send)

    def _too_large(self) -> Response:
        message = f"the request body is larger than {self.max_bytes} bytes (SERVE_MAX_BODY_BYTES)"
        return error_response(413, "payload_too_large", message, "body")

    def _too_slow(self) -> Response:
        message = f"the request body did not arrive within {self.timeout_s:g} s (SERVE_BODY_TIMEOUT_S)"
        return error_response(408, "request_timeout", message, "body", headers={"Connection": "close"})


class _BodyRefused(Exception):
    pass


class InternalErrorMiddleware(HttpMiddleware):
    """Outermost: turn any exception that escaped the app into our JSON 500. Unlike Starlette's
    ServerErrorMiddleware it does not re-raise, so uvicorn keeps the keep-alive connection usable. If the
    response had started (a stream), it can only be ended: the stream helpers report errors in-band first."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if not started:
                await internal_error_response(Request(scope), exc)(scope, receive, send)
                return
            log_internal_error(exc, f"{scope.get('method')} {scope['path']} (after the response started)")
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
