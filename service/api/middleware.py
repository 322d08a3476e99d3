"""Pure ASGI middleware (streaming-safe): request metrics and in-flight count, and the body size limit."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastapi import Request

from service.api.asgi import HttpMiddleware
from service.api.errors import error_response, internal_error_response, log_internal_error
from service.engine.metrics import Metrics

INFERENCE_PATHS = frozenset({"/v1/translate", "/v1/generate", "/v1/completions", "/v1/classify"})
# TGI / Inference API routes (service/api/hf.py); POST /models/{name} is one too.
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
                self.metrics.requests.labels(*key), self.metrics.request_duration.labels(*key)
            )
        return children


class BodyLimitMiddleware(HttpMiddleware):
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes (SERVE_MAX_BODY_BYTES)"
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(413, "payload_too_large", message, "body")(scope, receive, send)
            return
        received = 0
        too_large = False

        async def limited() -> Message:  # chunked bodies declare no length: count as they arrive
            nonlocal received, too_large
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.max_bytes:
                    too_large = True
                    raise _BodyTooLarge
            return msg

        async def unless_too_large(msg: Message) -> None:
            if not too_large:  # FastAPI answers a failed body read itself (400): replace that with 413
                await send(msg)

        with contextlib.suppress(_BodyTooLarge):
            await self.app(scope, limited, unless_too_large)
        if too_large:
            await error_response(413, "payload_too_large", message, "body")(scope, receive, send)


class _BodyTooLarge(Exception):
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
