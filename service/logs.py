"""Logging setup: plain text lines (the default) or one JSON object per line (SERVE_LOG_FORMAT=json),
for log collectors. Every record made while a request is handled carries its `request_id`: a text line
shows it in brackets after the logger name, a JSON line as the `request_id` field."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from service.request_context import REQUEST_ID

# `request_tag` is " [<request id>]" on lines logged while a request is handled, else empty.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request_tag = f" [{request_id}]" if request_id else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, format: str) -> dict[str, Any] | None:
    """Set up the root logger; return the `log_config` to give uvicorn (None: its loggers propagate to
    the root, so its access and error lines come out in the same format)."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    return None
