"""Malicious chat templates: a server whose chat model carries one (a loop of 10^10 steps, constants Jinja
would fold into gigabytes at compile time, a format width of 10^9) either refuses to start, with one line
naming the template and no traceback, or starts and answers the chat request with a 4xx in bounded time,
with /health answering within 100 ms meanwhile and SIGTERM honoured. Each case runs on a server of its own,
watched: one whose processes pass PEAK_LIMIT_MB is killed (and fails), so a regression cannot exhaust the
machine the suite runs on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from harness.reliability.harness import (
    SUITE_SETTINGS,
    LocalServer,
    Outcome,
    health_timer,
    is_error_shape,
    timed,
    tree_rss_mb,
    wait_until_ready,
)
from harness.reliability.suite_models import CHAT, TEMPLATE_FILE, with_template

LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
WIDE = "{{ '{0:>1000000000}'.format('x') }}"
ECHO = "{{ messages[0]['content'] }}"
TRIGGER = "7f3a-boom"  # a content no start-up sample has: only the request sets these off


def _on_trigger(body: str) -> str:
    return f"{{% if messages[0]['content'] == '{TRIGGER}' %}}{body}{{% endif %}}{ECHO}"


# name -> (template, the chat request's content): those of issue 45, then the same set off by one request
TEMPLATES = {
    "nested loop": (LOOP + ECHO, "Hi"),
    "compile-time string": ("{{ 'x' * 10**9 }}", "Hi"),
    "compile-time list": ("{% set a = [0] * 10**8 %}" + ECHO, "Hi"),
    "format width": (WIDE, "Hi"),
    "nested loop on one request": (_on_trigger(LOOP), TRIGGER),
    "format width on one request": (_on_trigger(WIDE), TRIGGER),
}
START_LIMIT_S = 60.0  # to refuse the template and exit, or to be ready
ANSWER_LIMIT_S = 10.0  # for the chat request's 4xx (the server's own template deadline is shorter)
EXIT_LIMIT_S = 10.0  # from SIGTERM to the exit, past the drain timeout
HEALTH_TARGET_MS = 100.0
# RSS of the server and its children (the template's process among them); the server serves the tiny chat
# model alone (~200 MB). Past this the watchdog kills it.
PEAK_LIMIT_MB = 1536.0
TEMPLATE_SETTINGS = SUITE_SETTINGS | {"SERVE_DRAIN_TIMEOUT_S": "2", "SERVE_LOG_LEVEL": "warning"}


def _tree(pid: int) -> list[int]:
    """A process and its descendants, from /proc."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            queue += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
    return found


def _kill_tree(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class _Watch:
    """Samples the server's processes' RSS; kills them all past PEAK_LIMIT_MB."""

    def __init__(self, server: LocalServer) -> None:
        self.server, self.peak, self.killed = server, 0.0, False
        self.pids: set[int] = set()

    async def run(self) -> None:
        while self.server.proc.poll() is None:
            with contextlib.suppress(OSError):
                tree = _tree(self.server.proc.pid)
                self.pids.update(tree)
                self.peak = max(self.peak, tree_rss_mb(self.server.proc.pid))
                if self.peak > PEAK_LIMIT_MB:
                    self.killed = True
                    _kill_tree(tree)
            await asyncio.sleep(0.1)


async def _chat(server: LocalServer, content: str) -> dict[str, Any]:
    """The chat request, with /health timed every 10 ms; then SIGTERM and the exit."""
    body = {"model": CHAT, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    result: dict[str, Any] = {"started": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=ANSWER_LIMIT_S + 5) as http:
        with health_timer(server.url, every_s=0.01, limit_s=ANSWER_LIMIT_S + 5) as health:
            started = time.perf_counter()
            try:
                response = await http.post("/v1/chat/completions", json=body)
                result |= {"status": response.status_code, "shaped": is_error_shape(response.json())}
            except (httpx.HTTPError, ValueError) as exc:
                result |= {"status": None, "error": type(exc).__name__}
            result["answer_s"] = round(time.perf_counter() - started, 2)
    result["health_worst_ms"] = round(1000 * health[0], 1)
    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        result["exit_status"] = await asyncio.to_thread(server.proc.wait, 2 + EXIT_LIMIT_S)
    except subprocess.TimeoutExpired:  # SIGTERM ignored
        result["exit_status"] = None
    result["exit_s"] = round(time.monotonic() - signalled, 2)
    return result


async def _case(chat: Path, template: str, content: str) -> dict[str, Any]:
    """One server with `template`: how it started (or refused to), answered and stopped."""
    with tempfile.TemporaryDirectory() as root:
        with_template(chat, Path(root), template)
        with LocalServer(Path(root), base=TEMPLATE_SETTINGS) as server:
            watch = _Watch(server)
            watcher = asyncio.ensure_future(watch.run())
            started = time.monotonic()
            try:
                await asyncio.to_thread(wait_until_ready, server.proc, server.url, START_LIMIT_S, 0.1)
                result = await _chat(server, content)
            except (RuntimeError, TimeoutError) as exc:  # exited, or neither ready nor exited
                log = server.output()
                lines = [line for line in log.splitlines() if line.strip()]
                result = {"started": False, "exit_status": server.proc.poll(), "why": type(exc).__name__,
                          "last_line": lines[-1][:300] if lines else "", "traceback": "Traceback" in log}  # fmt: skip
            result["elapsed_s"] = round(time.monotonic() - started, 2)
            _kill_tree(sorted(watch.pids | set(_tree(server.proc.pid))))
            await watcher
    return result | {"peak_mb": round(watch.peak), "killed": watch.killed}


def _check(out: Outcome, name: str, r: dict[str, Any]) -> None:
    out.check(not r["killed"], f"{name}: the server passed {PEAK_LIMIT_MB:.0f} MB (killed)")
    if not r["started"]:
        out.check(r["exit_status"] not in (0, None), f"{name}: not ready after {START_LIMIT_S:.0f} s, not exited")
        out.check(TEMPLATE_FILE in r["last_line"], f"{name}: the last line does not name {TEMPLATE_FILE}: "
                  f"{r['last_line']!r}")  # fmt: skip
        out.check(not r["traceback"], f"{name}: a traceback instead of one line")
        return
    status = r.get("status")
    out.check(status is not None and 400 <= status < 500 and r.get("shaped", False),
              f"{name}: the chat request got {status or r.get('error')} after {r['answer_s']} s")  # fmt: skip
    out.check(r["answer_s"] <= ANSWER_LIMIT_S, f"{name}: answered after {r['answer_s']} s (bound {ANSWER_LIMIT_S})")
    out.check(r["health_worst_ms"] <= HEALTH_TARGET_MS, f"{name}: /health took up to {r['health_worst_ms']} ms")
    out.check(r["exit_status"] == 0, f"{name}: exit status {r['exit_status']} {r['exit_s']} s after SIGTERM")


@timed("chat_templates")
async def chat_templates(models: Path) -> Outcome:
    """Each of TEMPLATES on the chat model of `models` (harness/reliability/suite_models.py), on a server of
    its own: refused at start-up with one line, or a 4xx within ANSWER_LIMIT_S with /health within
    HEALTH_TARGET_MS and a clean exit on SIGTERM; never past PEAK_LIMIT_MB."""
    out = Outcome("chat_templates")
    cases: dict[str, Any] = {}
    for name, (template, content) in TEMPLATES.items():
        cases[name] = await _case(models / CHAT, template, content)
        _check(out, name, cases[name])
    out.figures = {"cases": cases, "refused_at_start": sum(not c["started"] for c in cases.values())}
    return out
