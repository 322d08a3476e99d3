"""Parse a Server-Sent Events body (shared by the streaming tests)."""

import json
from typing import Any


def events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Each event as (name, data); each event's bytes must be valid UTF-8 on their own."""
    parsed = []
    for block in body.split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.decode("utf-8").split("\n")  # raises if a character was split across events
        name = next(line[7:] for line in lines if line.startswith("event: "))
        data = json.loads(next(line[6:] for line in lines if line.startswith("data: ")))
        parsed.append((name, data))
    return parsed
