"""harness/reliability/contract.py reads schemathesis's ndjson report: a failed check names its request and
the answer that failed it; a schema-valid request refused for a token-dependent limit (which the OpenAPI
document cannot state, and says so) is counted apart, not failed."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from harness.reliability.contract import read_reports


def recorded(data: bytes) -> dict[str, str]:
    return {"$base64": base64.b64encode(data).decode()}


def rejection(text: str, message: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The interaction and check results of a schema-valid POST /v1/translate answered 422 `message`."""
    body = json.dumps({"text": text, "return_attention": True}).encode()
    error = json.dumps({"error": {"type": "invalid_input", "message": message, "field": "text"}}).encode()
    interaction = {
        "request": {"method": "POST", "uri": "http://x/v1/translate", "body": recorded(body)},
        "response": {"status_code": 422, "content": recorded(error)},
    }
    failure = {"code": "ST202", "title": "Schema-valid request rejected", "operation": "POST /v1/translate"}
    return interaction, [{"status": "failure", "failure_info": {"failure": failure}}]


def test_failed_checks_name_their_request_and_answer_and_token_limits_count_apart(tmp_path: Path) -> None:
    empty, empty_checks = rejection(" x", "the text is empty")
    too_long = "attention maps are limited to 256 tokens; this request needs 257"
    long, long_checks = rejection("a long text", too_long)
    recorder = {
        "interactions": {"c1": empty, "c2": long, "c3": {"response": {"status_code": 200, "content": None}}},
        "checks": {"c1": empty_checks, "c2": long_checks, "c3": [{"status": "success"}]},
    }
    (tmp_path / "report.ndjson").write_text(json.dumps({"ScenarioFinished": {"recorder": recorder}}) + "\n")
    report = read_reports(tmp_path)
    assert report.requests == 3 and report.statuses == {"4xx": 2, "2xx": 1}
    assert report.token_limit_refusals == 1
    (failure,) = report.failures
    assert failure.startswith("ST202 Schema-valid request rejected: POST /v1/translate")
    assert 'POST http://x/v1/translate {"text": " x"' in failure and "422" in failure and "the text is empty" in failure
