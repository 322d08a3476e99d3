"""The table of the reliability report in docs/testing.md (DOC): one row per section, its main figures and
the result, between DOC_BEGIN and DOC_END."""

from __future__ import annotations

from typing import Any

DOC = "docs/testing.md"
DOC_BEGIN = "<!-- reliability:begin (python -m harness.reliability --doc) -->"
DOC_END = "<!-- reliability:end -->"

CHECKS = {
    "schemathesis": (
        "every operation of /openapi.json, positive and negative data, every check: no 5xx, responses match "
        "the schema, valid requests accepted (or refused for a token-dependent limit the document names, "
        "counted apart) and invalid ones refused, no undocumented method answers; chat, embeddings, /embed "
        "and /rerank driven to answers (2xx), not only refusals"
    ),
    "bad_input": (
        "malformed bodies (UTF-8, surrogates, NaN, nesting, huge numbers/lists/bodies, chunked), chat bodies "
        "(bad roles and contents, huge message lists, n, tool calls and tool choices that break the rules, "
        "response formats), bad embeddings, /embed and /rerank bodies: a 4xx in the route's error shape, "
        "healthy after each"
    ),
    "load": ("mixed requests at concurrency 64 (generate, completions, translate, classify, chat streamed and "
             "not, embeddings, /embed, /rerank), each answer equal to the same request sent alone (seeded "
             "sampling: or differing first at a neighbouring token id, docs/api.md \"Generate\")"),
    "attention": (
        "return_attention: over the limit refused at once; the largest allowed answer bounded, "
        "/health responsive, memory returned; 96 at once: a few admitted by each front end's budget, 429 + "
        "Retry-After for the rest, RSS bounded by the budget and back within 10 s"
    ),
    "tokenize": (
        "8 concurrent ~900 KB /tokenize, then /v1/generate, then /v1/classify: off the event loop "
        "(/health timed apart), 422 naming the field past the token limit"
    ),
    "list_bombs": (
        "8 concurrent bodies of one 100,000-item list on each route that takes a list: each a 4xx in the route's "
        "shape, /health (every 10 ms, timed apart) within 100 ms"
    ),
    "memory": (
        "96 concurrent requests on each route in turn (embeddings, /embed, classify, generate 200 tokens, "
        "tokenize, chat), then 10 s idle: RSS (front ends included) within the bound of the start"
    ),
    "chat_templates": (
        "a chat model whose template loops 10^10 times, folds gigabyte constants or formats a 10^9 width "
        "(at start-up, or on one request): refused at start with one line, or a 4xx in bounded time with "
        "/health within 100 ms and exit 0 on SIGTERM; never past 1.5 GB"
    ),
    "disconnects": "clients hanging up mid-stream and mid-request: gauges back to 0",
    "overload": "10x capacity (batch rows + queue): only 200 or 429 + Retry-After, bounded queue, normal latency after",
    "soak": "steady mixed traffic, RSS sampled: no growth trend",
    "sigterm": "SIGTERM with streams in flight: exit 0 within the drain timeout, every stream ends with done or error",
    "artifacts": "mismatched config.json, broken tokenizer or graph: exit non-zero, one line naming the file",
    "faults": (
        "ORT failure mid-batch (every waiter errors, server recovers); a bug in a request (JSON 500, "
        "keep-alive kept, no request text logged); slow headers (408)"
    ),
    "slow_clients": (
        "bodies trickling in: 408 at SERVE_BODY_TIMEOUT_S, connection closed, in-flight slot freed; a trickling "
        "body after its answer closed; a POST on a keep-alive connection idle past httpx's 5 s pool expiry"
    ),
    "stuck_drain": (
        "SIGTERM with streams whose client never reads and uploads still trickling in: exit 0 within the "
        "drain timeout + 0.5 s, no traceback logged"
    ),
    "stuck_readers": (
        "streams whose client never reads: ended at SERVE_SEND_TIMEOUT_S, gauges at 0 within it + 1 s, "
        "connections closed, one warning with each request id, no traceback"
    ),
}


def _burst(f: dict[str, Any]) -> str:
    if "burst_statuses" not in f:
        return ""
    rss = (
        f", RSS {f['burst_rss_before_mb']} -> {f['burst_rss_peak_mb']} -> {f['burst_rss_after_mb']} MB"
        if "burst_rss_after_mb" in f
        else ""
    )
    return f"; {f['burst_clients']} at once: {f['burst_statuses']}{rss}, /health worst {f['burst_health_worst_ms']} ms"


def _new_sections(name: str, f: dict[str, Any]) -> str | None:
    """The figures of the sections issue 45 added (None: not one of them)."""
    if name == "list_bombs":
        worst = ", ".join(f"{route} {r['health_worst_ms']:.0f}" for route, r in f["routes"].items())
        return (f"{f['clients']} x {f['items']:,} items per route, /health worst (ms): {worst}; "
                f"worst {f['health_worst_ms']:.0f} ms ({f['worst_route']}), target {f['health_target_ms']:.0f}")
    if name == "memory":
        peaks = ", ".join(f"{route} {r['rss_after_mb']}" for route, r in f["routes"].items())
        return (f"RSS {f['rss_start_mb']} MB at the start; after each burst: {peaks}; {f['rss_end_mb']} MB "
                f"{f['settle_s']:.0f} s later: {f['kept_mb']:+} MB kept (bound {f['bound_mb']:.0f})")
    if name == "chat_templates":
        cases = "; ".join(
            f"{case}: refused at start in {c['elapsed_s']} s" if not c["started"]
            else f"{case}: {c.get('status')} in {c['answer_s']} s, /health worst {c['health_worst_ms']:.0f} ms, "
            f"exit {c['exit_status']} {c['exit_s']} s after SIGTERM"
            for case, c in f["cases"].items()
        )  # fmt: skip
        peak = max((c["peak_mb"] for c in f["cases"].values()), default=0)
        return f"{cases}; peak {peak} MB"
    return None


def _own_server_sections(name: str, f: dict[str, Any]) -> str | None:
    """The figures of the sections on servers of their own (None: not one of them)."""
    if name == "sigterm":
        return (
            f"{f['streams']} streams: {f['finished']} finished, {f['cut_with_error_event']} cut with an error event, "
            f"{f['unclean']} unclean; exit {f['exit_status']} after {f['exit_after_s']} s "
            f"(drain {f['drain_timeout_s']} s)"
        )
    if name == "artifacts":
        return f"{f['cases']} cases, exit within {f['max_exit_s']} s"
    if name == "faults":
        return (
            f"ORT failure: {f.get('ort_failure_errors')}/{f.get('ort_failure_waiters')} waiters got an error; "
            f"500 then keep-alive: {'/'.join(f.get('internal_error_then_keepalive', []))}; "
            f"slow header closed after {f.get('slow_header_closed_after_s')} s"
        )
    if name == "slow_clients":
        return (
            f"{f['got_408']}/{f['slow_bodies']} slow bodies got 408 after {f['answered_after_s']} s "
            f"(timeout {f['body_timeout_s']} s), in flight {f['in_flight_while_sending']} -> "
            f"{f['in_flight_after']}; answered-early body closed after {f['answered_without_body_closed_after_s']} s; "
            f"after {f['idle_s']} s idle: {'/'.join(f['keepalive_statuses'])}"
        )
    if name == "stuck_drain":
        return (
            f"{f['stuck_streams']} unread streams + {f['slow_uploads']} slow uploads in flight: exit "
            f"{f['exit_status']} after {f['exit_after_s']} s (drain {f['drain_timeout_s']} s), "
            f"{f['tracebacks']} tracebacks"
        )
    if name == "stuck_readers":
        return (
            f"{f['stuck_streams']} unread streams, {f['in_flight_while_stuck']} in flight: gauges at 0 after "
            f"{f['gauges_zero_after_s']} s (timeout {f['send_timeout_s']} s), {f['closed']} closed, "
            f"{f['warned']} warned, {f['tracebacks']} tracebacks"
        )
    return None


def _figures(name: str, f: dict[str, Any]) -> str:
    if (new := _new_sections(name, f)) is not None:
        return new
    if name == "schemathesis":
        answered = ", ".join(f"{op.split()[1]} {n}" for op, n in f.get("answered", {}).items())
        return (f"{f['requests']} requests, {f['server_errors']} 5xx, {f['failed_checks']} failed checks, "
                f"{f.get('token_limit_refusals', 0)} token-limit refusals; 2xx answers: {answered}")
    if name == "bad_input":
        families = ", ".join(f"{k} {v}" for k, v in f.get("by_family", {}).items())
        return f"{f['cases']} cases ({families}), statuses {f['statuses']}"
    if name == "load":
        routes = ", ".join(f"{path} {n}" for path, n in f.get("routes", {}).items())
        return (
            f"{f['requests']} requests ({routes}), {f['req_per_s']} req/s, p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms, "
            f"{f['mismatched']} mismatched (max score diff {f['max_score_diff']}), "
            f"{f.get('seeded_flips', 0)} seeded answers at a neighbouring id"
        )
    if name == "attention":
        rss = (
            f" RSS {f['rss_before_mb']} -> {f['rss_peak_mb']} -> {f['rss_after_mb']} MB;" if "rss_after_mb" in f else ""
        )
        return (
            f"over limit: {f['refused_status']} in {f['refused_ms']} ms; "
            f"{f['allowed_texts']} x {f['tokens_per_text']} tokens: {f['response_mb']} MB in {f['response_s']} s;"
            f"{rss} /health worst {f['health_worst_ms']} ms{_burst(f)}"
        )
    if name == "tokenize":
        rss = f"; RSS {f['rss_before_mb']} -> {f['rss_after_mb']} MB" if "rss_after_mb" in f else ""
        routes = "".join(
            f"; {route}: {g['statuses']} in {g['burst_s']} s, /health worst {g['health_worst_ms']} ms"
            for route in ("generate", "classify")
            if (g := f.get(route))
        )
        return (
            f"{f['clients']} x {f['prompt_bytes'] // 1000} KB: {f['statuses']} in {f['burst_s']} s, "
            f"/health worst {f['health_worst_ms']} ms{rss}{routes}"
        )
    if name == "disconnects":
        return f"{f['disconnects']} hang-ups, gauges at 0 after {f['gauges_zero_after_s']} s"
    if name == "overload":
        rss = f", RSS peak {f['rss_peak_mb']} MB" if "rss_peak_mb" in f else ""
        return (
            f"{f['clients']} clients, {f['requests']} requests: {f['ok']} x 200, {f['rejected_429']} x 429; "
            f"queue peak {f['peak_queue']}/{f['queue_limit']}{rss}; "
            f"latency {f['latency_before_ms']} -> {f['latency_after_ms']} ms"
        )
    if name == "soak":
        return (
            f"{f['seconds']:.0f} s, {f['requests']} requests, RSS {f['rss_start_mb']} -> {f['rss_end_mb']} MB "
            f"({f['slope_mb_per_min']} MB/min)"
        )
    if (own := _own_server_sections(name, f)) is not None:
        return own
    return ", ".join(f"{k} {v}" for k, v in f.items())


def table(report: dict[str, Any]) -> str:
    rows = [
        "| section | checks | figures | result |",
        "|---|---|---|---|",
    ]
    for name, section in report["sections"].items():
        base = name.split(" (")[0]  # "load (SERVE_API_PROCESSES=2)": the section's second run
        try:
            figures = _figures(base, section["figures"])
        except KeyError:
            figures = "; ".join(section["failures"])[:200]
        result = f"pass ({section['seconds']} s)" if section["passed"] else "**FAIL**"
        checks = CHECKS.get(name, "the same, with the HTTP front end in 2 processes" if base in CHECKS else "")
        rows.append(f"| {name} | {checks} | {figures} | {result} |")
    return "\n".join(rows)
