"""harness/reliability/contract.py reads schemathesis's ndjson report: a failed check names its request
and the answer that failed it (so a rare rejection can be told from the log alone)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from harness.reliability.contract import _read_reports


def test_a_failed_check_names_its_request_and_answer(tmp_path: Path) -> None:
    body = b'{"error": {"type": "invalid_input", "message": "the text is empty", "field": "text"}}'
    rejected = {"status_code": 422, "content": {"$base64": base64.b64encode(body).decode()}}
    failure_info = {
        "code_sample": "curl -X POST http://x/v1/translate -d '{\"text\": \" \"}'",
        "failure": {"code": "ST202", "title": "Schema-valid request rejected", "operation": "POST /v1/translate"},
    }
    recorder = {
        "interactions": {"c1": {"response": rejected}, "c2": {"response": {"status_code": 200, "content": None}}},
        "checks": {"c1": [{"status": "failure", "failure_info": failure_info}], "c2": [{"status": "success"}]},
    }
    event = {"ScenarioFinished": {"recorder": recorder}}
    (tmp_path / "report.ndjson").write_text(json.dumps(event) + "\n")
    requests, statuses, failures = _read_reports(tmp_path)
    assert requests == 2 and statuses == {"4xx": 1, "2xx": 1}
    (failure,) = failures
    assert failure.startswith("ST202 Schema-valid request rejected: POST /v1/translate")
    assert "/v1/translate -d" in failure and "422" in failure and "the text is empty" in failure
