"""Server-Sent Events: framing, and the streamed response shared by the streaming routes."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from functools import partial
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]  # typeshed omits the C encoder
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Send

from service.api.deps import unless_disconnected
from service.api.errors import error_body, log_internal_error
from service.api.keepalive import send_chunks
from service.api.responses import json_default, off_loop, render_with_maps
from service.engine.errors import EngineError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The C encoder that json.dumps(data, ensure_ascii=False, separators=(",", ":")) builds on every call
# (about half of its 2.8 us for a token event), built once: the same output. No cycle check: events are trees.
# Its `default` writes attention maps as placeholders while a large event renders (service/api/responses.py).
_encode = c_make_encoder(None, json_default, encode_basestring, None, ":", ",", False, False, True)
ErrorRenderer = Callable[[str, str, str | None], str]  # (type, message, field) -> one event


def stream_doc(events: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for a route that answers JSON, or an event stream with `stream: true`."""
    description = (
        f"JSON, or with `stream: true` an event stream: {events}, "
        "or `event: error` (`{type, error}`) if it fails after the first event."
    )
    return {200: {"description": description, "content": {"text/event-stream": {}}}}


def sse(data: Any, event: str | None = None) -> str:
    """One event. JSON keeps newlines out of `data:`; non-ASCII goes out as UTF-8 (whole characters)."""
    payload = data if isinstance(data, str) else "".join(_encode(data, 0))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def error_event(type: str, message: str, field: str | None = None) -> str:
    return sse({"type": "error", **error_body(type, message, field)}, "error")


def _large(event: Any) -> bool:
    """A final event that carries attention maps (up to SERVE_MAX_ATTENTION_VALUES numbers) is serialized
    on a worker thread, as large JSON answers are (service/api/responses.py): the event loop stays free."""
    return getattr(event, "attention", None) is not None


async def _events(
    first: Any, events: AsyncGenerator[Any, None], render: Callable[[Any], str], on_error: ErrorRenderer
) -> AsyncGenerator[str, None]:
    try:
        yield await off_loop(render_with_maps, partial(render, first)) if _large(first) else render(first)
        async for event in events:  # no coroutine per event: a token is rendered right here
            yield await off_loop(render_with_maps, partial(render, event)) if _large(event) else render(event)
    except EngineError as exc:  # after the first event the status is sent: report in-band
        yield on_error(exc.type, exc.message, exc.field)
    except Exception as exc:
        log_internal_error(exc, "event stream")
        yield on_error("internal_error", "internal server error", None)
    finally:
        await events.aclose()


async def event_stream(
    request: Request,
    events: AsyncGenerator[Any, None],
    render: Callable[[Any], str],
    on_error: ErrorRenderer = error_event,
) -> StreamingResponse:
    """Wait for the first event before answering 200, so queueing and prefill errors get a real status;
    then stream every event rendered by `render`, and an `error` event if the engine fails mid-way."""
    first = await unless_disconnected(request, anext(events))
    return streaming_response(request, _events(first, events, render, on_error))


class EventStreamResponse(StreamingResponse):
    """StreamingResponse with keep-alive comments sent beside the chunks (service/api/keepalive.py)."""

    def __init__(self, chunks: AsyncGenerator[str, None], keepalive_s: float) -> None:
        super().__init__(chunks, media_type="text/event-stream", headers=SSE_HEADERS)
        self.chunks, self.keepalive_s = chunks, keepalive_s

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send_chunks(self.chunks, send, self.keepalive_s)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def streaming_response(request: Request, chunks: AsyncGenerator[str, None]) -> StreamingResponse:
    """The event-stream response of every streaming route, with keep-alive comments (SERVE_SSE_KEEPALIVE_S)."""
    return EventStreamResponse(chunks, request.app.state.settings.sse_keepalive_s)
