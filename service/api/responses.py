"""Large JSON responses (attention maps): serialized off the event loop, so /health and the other requests
keep being answered, on one thread of their own (one at a time, and their big allocations in one malloc
arena rather than one per pool thread, each keeping its own freed top). Each map arrives as its JSON text
(service/engine/attention.py): the serializers write a placeholder for it and the text is put in its place,
so no map becomes millions of Python floats on the way out. The heap goes back to the OS after a burst
(service/api/asgi/budget.py)."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from fastapi.responses import Response
from pydantic import BaseModel

from service.engine.attention import AttentionMap

T = TypeVar("T")
_serializer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-json")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the large-JSON thread."""
    return await asyncio.get_running_loop().run_in_executor(_serializer, fn, *args)


class Placeholders:
    """Maps met while serializing, each written as a string no request can forge (a random key), then
    replaced by the map's own text."""

    def __init__(self) -> None:
        self.key = secrets.token_hex(8)
        self.texts: list[str] = []

    def of(self, value: Any) -> str:
        if not isinstance(value, AttentionMap):
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        self.texts.append(value.json)
        return f"@map:{self.key}:{len(self.texts) - 1}"

    def fill(self, text: str) -> str:
        if not self.texts:
            return text
        pieces = re.split(f'"@map:{self.key}:([0-9]+)"', text)
        pieces[1::2] = [self.texts[int(i)] for i in pieces[1::2]]
        return "".join(pieces)


_current: ContextVar[Placeholders | None] = ContextVar("placeholders", default=None)


@contextmanager
def placing_maps() -> Iterator[Placeholders]:
    """While the block runs, `json_default` writes maps as placeholders of the yielded Placeholders."""
    placeholders = Placeholders()
    token = _current.set(placeholders)
    try:
        yield placeholders
    finally:
        _current.reset(token)


def json_default(value: Any) -> Any:
    """The `default` of a JSON encoder: a map's placeholder inside `placing_maps`, else json's own TypeError."""
    placeholders = _current.get()
    if placeholders is None:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return placeholders.of(value)


def render_with_maps(render: Callable[[], str]) -> str:
    """`render()` (which encodes with `json_default`), with the maps' text in place."""
    with placing_maps() as placeholders:
        return placeholders.fill(render())


class JSONBytes(Response):
    """A body already rendered as JSON (a route returning a response model needs none: FastAPI renders it
    with pydantic's own serializer, about 1 us for a small model)."""

    media_type = "application/json"


def dump_json(model: BaseModel) -> bytes:
    placeholders = Placeholders()
    return placeholders.fill(model.model_dump_json(exclude_none=True, fallback=placeholders.of)).encode()


async def large_json(model: BaseModel) -> Response:
    return Response(await off_loop(dump_json, model), media_type="application/json")
