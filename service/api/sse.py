"""Server-Sent Events framing."""

from __future__ import annotations

import json
from typing import Any

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: Any, event: str | None = None) -> str:
    """One event. JSON keeps newlines out of `data:`; non-ASCII goes out as UTF-8 (whole characters)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
