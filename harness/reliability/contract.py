"""Does the API keep its contract: schemathesis over every operation of /openapi.json (harness/reliability/
bad_input.py has the malformed inputs)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.reliability.harness import Outcome, Target, client, served, timed

# --- schemathesis -----------------------------------------------------------------------------------

# Every check: among them positive_data_acceptance (ST202: a request the document calls valid must not get
# a 4xx), negative_data_rejection, and that a method the document does not list answers 405 with an Allow
# header naming those it does (an undocumented route that answers is a failure).
SCHEMATHESIS_CHECKS = "all"


# What the OpenAPI document cannot state, because it depends on tokenizing the text: the descriptions say so
# and a 422 answers it (service/api/docs/openapi_limits.py). A schema-valid request refused for one of these is
# the documented behaviour, counted apart; any other refusal of schema-valid data fails the check.
TOKEN_DEPENDENT_LIMITS = (
    "attention maps are limited to",  # tokens in and out of a request asking for its attention maps
    "the attention maps would hold",  # SERVE_MAX_ATTENTION_VALUES
    "tokens; the limit is",  # a text or prompt past SERVE_MAX_INPUT_TOKENS or the model's context
    "(SERVE_MAX_NEW_TOKENS)",  # a generation budget past the cap where the context has room for more
    # Structured outputs and tools: what llguidance compiles, schemas sent as JSON text, and the rules across
    # fields that the document leaves out (stated as JSON Schema, they leave a body schemathesis cannot draw
    # from: tests/service/test_api_chat.py checks that it can).
    "constraint cannot be used",
    "not a JSON schema",
    "one constraint at a time",
    "tool_choice forces a tool call",
    "function names must be unique",
    "among tools",
    "a call's arguments must be",
)


@dataclass
class Report:
    """What schemathesis's ndjson reports say: requests answered, their count per status class, the failed
    checks (each naming its request and the answer that failed it), and the schema-valid requests refused
    for a token-dependent limit."""

    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    failures: set[str] = field(default_factory=set)
    token_limit_refusals: int = 0
    answered: dict[str, int] = field(default_factory=dict)  # "POST /path" -> its 2xx answers


# The routes whose models the suite serves besides the committed artifacts (chat, reranker), and the
# embedder's: each must be driven to answers (2xx), not only to refusals.
DRIVEN = {
    "POST /v1/chat/completions": "chat",
    "POST /v1/embeddings": "embedder",
    "POST /embed": "embedder",
    "POST /rerank": "reranker",
}


@timed("schemathesis")
async def schemathesis(target: Target, max_examples: int = 10, seed: int = 1) -> Outcome:
    """Every operation of /openapi.json, positive and negative data, every check, bounded examples per
    operation (each phase: the document's examples, boundary values, generated data, stateful links)."""
    out = Outcome("schemathesis")
    with tempfile.TemporaryDirectory() as reports:
        command = [
            sys.executable, "-m", "schemathesis.cli", "run", f"{target.url}/openapi.json",
            "--mode", "all", "--max-examples", str(max_examples), "--seed", str(seed),
            "--checks", SCHEMATHESIS_CHECKS, "--request-timeout", "60", "--workers", "2",
            "--no-color", "--generation-database", "none", "--report", "ndjson", "--report-dir", reports,
        ]  # fmt: skip
        run = subprocess.run  # in the temporary folder: schemathesis keeps a cache (.schemathesis/) in its cwd
        proc = await asyncio.to_thread(run, command, cwd=reports, capture_output=True, text=True, timeout=900)
        report = read_reports(Path(reports))
    statuses = report.statuses
    driven = {operation: report.answered.get(operation, 0) for operation in DRIVEN}
    out.figures = {"requests": report.requests, "by_status": dict(sorted(statuses.items())),
                   "failed_checks": len(report.failures), "token_limit_refusals": report.token_limit_refusals,
                   "server_errors": statuses.get("5xx", 0), "answered": driven}  # fmt: skip
    async with client(target.url, connections=2) as http:
        models = await served(http)
    for operation, model in DRIVEN.items():
        out.check(model not in models or driven[operation] > 0, f"{operation} ({model} served): no 2xx answer")
    out.check(report.requests > 0, f"schemathesis sent no requests:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    out.failures += sorted(report.failures)
    tail = "\n".join(proc.stdout.splitlines()[-40:])
    # Exit status 1: failed checks (those listed, or only documented refusals); anything else: the run broke.
    failed_checks = proc.returncode == 1 and bool(report.failures or report.token_limit_refusals)
    out.check(proc.returncode == 0 or failed_checks, "schemathesis failed:\n" + tail)
    out.check(statuses.get("5xx", 0) == 0, f"{statuses.get('5xx', 0)} server errors")
    return out


def read_reports(reports: Path) -> Report:
    report = Report()
    for path in reports.glob("*.ndjson"):
        for line in path.read_text().splitlines():
            for kind, payload in json.loads(line).items():
                if kind == "ScenarioFinished":
                    _read_scenario(payload.get("recorder", {}), report)
    return report


def _read_scenario(recorder: dict[str, Any], report: Report) -> None:
    interactions = recorder.get("interactions", {})
    for interaction in interactions.values():
        response = interaction.get("response")
        if response is not None:
            report.requests += 1
            key = f"{response['status_code'] // 100}xx"
            report.statuses[key] = report.statuses.get(key, 0) + 1
            request = interaction.get("request") or {}
            operation = f"{request.get('method')} {urlsplit(str(request.get('uri', ''))).path}"
            if key == "2xx":
                report.answered[operation] = report.answered.get(operation, 0) + 1
    for case_id, results in recorder.get("checks", {}).items():
        for result in results:
            if result.get("status") != "failure":
                continue
            info = result.get("failure_info", {}).get("failure", {})
            interaction = interactions.get(case_id, {})
            response = interaction.get("response") or {}
            body = _text(response.get("content"))
            if info.get("code") == "ST202" and response.get("status_code") == 422 and any(
                limit in body for limit in TOKEN_DEPENDENT_LIMITS
            ):
                report.token_limit_refusals += 1
                continue
            request = interaction.get("request") or {}
            report.failures.add(
                f"{info.get('code')} {info.get('title')}: {info.get('operation')}\n"
                f"  request: {request.get('method')} {request.get('uri')} {_text(request.get('body'))[:600]}\n"
                f"  answer: {response.get('status_code')} {body[:300]}"
            )


def _text(payload: Any) -> str:
    """A recorded body as text: schemathesis's ndjson report writes bytes as {"$base64": ...}."""
    if isinstance(payload, dict) and "$base64" in payload:
        return base64.b64decode(payload["$base64"]).decode("utf-8", "replace")
    return "" if payload is None else str(payload)
