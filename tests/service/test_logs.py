"""Log lines in both formats carry the id of the request they were logged for (docs/operations.md, "Requests,
logs and metrics")."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from service.logs import configure_logging
from service.request_context import REQUEST_ID


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers: put the test run's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _line(log_format: str, request_id: str | None) -> str:
    configure_logging("info", log_format)
    (handler,) = logging.getLogger().handlers
    record = logging.LogRecord("service.x", logging.WARNING, __file__, 1, "queue %s", ("full",), None)
    token = REQUEST_ID.set(request_id)
    try:
        for filter_ in handler.filters:
            assert isinstance(filter_, logging.Filter)  # RequestIdFilter
            filter_.filter(record)
    finally:
        REQUEST_ID.reset(token)
    return handler.format(record)


def test_text_lines_carry_the_request_id(restore_root_logger: None) -> None:
    assert _line("text", "req-7").endswith(" WARNING service.x [req-7]: queue full")
    assert _line("text", None).endswith(" WARNING service.x: queue full")  # outside a request


def test_json_lines_carry_the_request_id(restore_root_logger: None) -> None:
    assert json.loads(_line("json", "req-7"))["request_id"] == "req-7"
    assert "request_id" not in json.loads(_line("json", None))
