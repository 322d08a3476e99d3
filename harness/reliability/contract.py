"""Does the API keep its contract: schemathesis over every operation of /openapi.json, and a list
of malformed inputs that must each get a 4xx in the error shape, the server healthy after each."""

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

import httpx

from harness.reliability.harness import (
    Outcome,
    Target,
    client,
    is_error_shape,
    model_ids,
    timed,
)

# --- schemathesis -----------------------------------------------------------------------------------

# Every check: among them positive_data_acceptance (ST202: a request the document calls valid must not get
# a 4xx), negative_data_rejection, and that a method the document does not list answers 405 with an Allow
# header naming those it does (an undocumented route that answers is a failure).
SCHEMATHESIS_CHECKS = "all"


# What the OpenAPI document cannot state, because it depends on tokenizing the text: the descriptions say so
# and a 422 answers it (service/api/openapi_limits.py). A schema-valid request refused for one of these is
# the documented behaviour, counted apart; any other refusal of schema-valid data fails the check.
TOKEN_DEPENDENT_LIMITS = (
    "attention maps are limited to",  # tokens in and out of a request asking for its attention maps
    "the attention maps would hold",  # SERVE_MAX_ATTENTION_VALUES
    "tokens; the limit is",  # a text or prompt past SERVE_MAX_INPUT_TOKENS or the model's context
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
    out.figures = {"requests": report.requests, "by_status": dict(sorted(statuses.items())),
                   "failed_checks": len(report.failures), "token_limit_refusals": report.token_limit_refusals,
                   "server_errors": statuses.get("5xx", 0)}  # fmt: skip
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


# --- bad input ----------------------------------------------------------------------------------------


def _chunks(data: bytes, size: int = 65536) -> Any:
    async def gen() -> Any:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return gen()


def bad_inputs(generator: str) -> list[tuple[str, str, Any, dict[str, str]]]:
    """(name, path, body, headers): each must get a 4xx in our error shape. `body` is bytes, or an async
    iterator of bytes (a chunked body)."""
    big = b'{"text": "' + b"a" * (20 << 20) + b'"}'

    def biased(logit_bias: dict[str, int]) -> bytes:
        return json.dumps({"model": generator, "prompt": "hi", "max_tokens": 2, "logit_bias": logit_bias}).encode()

    json_ = {"content-type": "application/json"}
    cases: list[tuple[str, str, Any, dict[str, str]]] = [
        ("invalid JSON", "/v1/classify", b'{"text": ', json_),
        ("invalid UTF-8", "/v1/classify", b'{"text": "\xff\xfe bad"}', json_),
        ("lone surrogate", "/v1/classify", b'{"text": "\\ud800"}', json_),
        ("lone surrogate (generate)", "/v1/generate", b'{"prompt": "a\\udfff b", "max_new_tokens": 2}', json_),
        ("lone surrogate (translate)", "/v1/translate", b'{"text": "\\udc00", "num_beams": 1}', json_),
        ("NaN", "/v1/generate", b'{"prompt": "hi", "temperature": NaN}', json_),
        ("Infinity", "/v1/generate", b'{"prompt": "hi", "top_p": Infinity}', json_),
        ("-Infinity", "/v1/translate", b'{"text": "hi", "length_penalty": -Infinity}', json_),
        ("deep nesting", "/v1/classify", b"[" * 100_000 + b"]" * 100_000, json_),
        ("deep nesting in a field", "/v1/classify", b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", json_),
        ("huge integer", "/v1/generate", b'{"prompt": "hi", "seed": 1' + b"0" * 5000 + b"}", json_),
        ("huge float", "/v1/generate", b'{"prompt": "hi", "max_new_tokens": 1e400}', json_),
        ("int64 overflow", "/v1/generate", b'{"prompt": "hi", "seed": 99999999999999999999999}', json_),
        ("token id out of vocabulary", "/v1/generate", b'{"prompt": [1, 99999999], "max_new_tokens": 2}', json_),
        ("token id beyond int64", "/v1/generate", b'{"prompt": [36893488147419103232]}', json_),
        ("top_k beyond int64", "/v1/generate",
         b'{"prompt": "hi", "max_new_tokens": 2, "top_k": 9223372036854775808}', json_),
        ("top_k beyond int64 (greedy)", "/v1/generate",
         b'{"prompt": "hi", "max_new_tokens": 2, "temperature": 0, "top_k": 9223372036854775808}', json_),
        ("top_k beyond int64 (completions)", "/v1/completions",
         json.dumps({"model": generator, "prompt": "hi", "max_tokens": 2, "top_k": 2**63}).encode(), json_),
        ("top_k beyond int64 (translate)", "/v1/translate",
         b'{"text": "hi", "num_beams": 1, "do_sample": true, "top_k": 9223372036854775808}', json_),
        ("top_k beyond int64 (TGI)", "/generate",
         b'{"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_k": 9223372036854775808}}', json_),
        ("negative token id", "/v1/completions", json.dumps({"model": generator, "prompt": [-1]}).encode(), json_),
        ("logit_bias superscript key", "/v1/completions",
         biased({"²": 1}), json_),
        ("logit_bias Arabic-Indic key", "/v1/completions",
         biased({"١": 1}), json_),
        ("logit_bias 5,000-digit key", "/v1/completions",
         biased({"9" * 5000: 1}), json_),
        ("logit_bias id out of vocabulary", "/v1/completions",
         biased({"99999": 1}), json_),
        ("huge list", "/v1/classify", json.dumps({"text": ["a"] * 100_000}).encode(), json_),
        ("huge stop list", "/v1/generate", json.dumps({"prompt": "hi", "stop": ["x"] * 10_000}).encode(), json_),
        ("20 MB body", "/v1/classify", big, json_),
        ("20 MB chunked body", "/v1/classify", _chunks(big), json_),
        ("chunked invalid JSON", "/v1/generate", _chunks(b'{"prompt": [' * 1000), json_),
        ("empty body", "/v1/generate", b"", json_),
        ("JSON array", "/v1/generate", b"[]", json_),
        ("JSON null", "/v1/translate", b"null", json_),
        ("unknown field", "/v1/generate", b'{"prompt": "hi", "bogus": 1}', json_),
        ("wrong type", "/v1/generate", b'{"prompt": 5}', json_),
        ("text/plain body", "/v1/classify", b"hello", {"content-type": "text/plain"}),
        ("empty text", "/v1/classify", b'{"text": ""}', json_),
        ("whitespace text", "/v1/translate", b'{"text": "   "}', json_),
        ("top_logprobs without logprobs", "/v1/generate", b'{"prompt": "hi", "top_logprobs": 3}', json_),
        ("stream with beams", "/v1/translate", b'{"text": "hi", "stream": true, "num_beams": 4}', json_),
        ("top_k above the labels", "/v1/classify", b'{"text": "hi", "top_k": 99}', json_),
        ("unknown model", "/v1/completions", b'{"model": "gpt-4", "prompt": "hi"}', json_),
    ]  # fmt: skip
    return cases


@timed("bad_input")
async def bad_input(target: Target) -> Outcome:
    out = Outcome("bad_input")
    statuses: dict[str, int] = {}
    async with client(target.url, connections=4) as http:
        generator = (await model_ids(http)).get("generation", "generator")
        for name, path, body, headers in bad_inputs(generator):
            try:
                response = await http.post(path, content=body, headers=headers)
            except httpx.HTTPError as exc:
                out.failures.append(f"{name}: no response ({type(exc).__name__})")
                continue
            statuses[name] = response.status_code
            try:
                shaped = is_error_shape(response.json())
            except ValueError:
                shaped = False
            out.check(400 <= response.status_code < 500, f"{name}: status {response.status_code}")
            out.check(shaped, f"{name}: not the error shape: {response.text[:200]}")
            health = await http.get("/health")
            out.check(health.status_code == 200, f"{name}: /health {health.status_code} afterwards")
    out.figures = {
        "cases": len(statuses),
        "statuses": dict(sorted({s: list(statuses.values()).count(s) for s in statuses.values()}.items())),
    }
    return out
