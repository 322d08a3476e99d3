"""SIGTERM under load: long and short streams on the native and the OpenAI routes when the signal comes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from harness.reliability.harness import Outcome, Target, client, iter_sse, model_ids, timed

Events = list[tuple[str, str]]


class _Streams:
    """Streamed requests on one client; `all_started` is set once `total` of them have had their first event."""

    def __init__(self, http: httpx.AsyncClient, total: int) -> None:
        self.http, self.total = http, total
        self.started = 0
        self.all_started = asyncio.Event()

    async def stream(self, path: str, body: dict[str, Any]) -> tuple[str, Events]:
        """How the stream ended ("ok", or the status or transport error that cut it) and its events."""
        events: Events = []
        try:
            async with self.http.stream("POST", path, json=body | {"stream": True, "ignore_eos": True}) as response:
                if response.status_code != 200:
                    return f"status {response.status_code}", events
                async for event in iter_sse(response):
                    if not events:
                        self.started += 1
                        if self.started == self.total:
                            self.all_started.set()
                    events.append(event)
        except httpx.HTTPError as exc:
            return f"transport error {type(exc).__name__}", events
        return "ok", events

    def generate(self, max_new: int) -> Any:
        return self.stream("/v1/generate", {"prompt": "Once", "max_new_tokens": max_new})

    def completion(self, model: str, max_new: int) -> Any:
        return self.stream("/v1/completions", {"model": model, "prompt": "Once", "max_tokens": max_new})


def _tally(out: Outcome, results: list[tuple[str, Events]], openai: range) -> tuple[int, int, int]:
    """(streams finished, streams cut with an error event, unclean ends); each unclean end into `out`.
    The streams of the indices in `openai` end with `[DONE]` (after an error chunk when cut), the others
    with a `done` or an `error` event."""
    finished = cut = unclean = 0
    for i, (how, events) in enumerate(results):
        if how != "ok":
            unclean += 1
            out.failures.append(f"stream {i}: {how}")
            continue
        if i in openai:
            data = [d for _, d in events]
            errored = any('"error"' in d for d in data)
            clean = bool(data) and data[-1] == "[DONE]"
            finished += clean and not errored
            cut += clean and errored
        else:
            last = events[-1][0] if events else ""
            clean = last in ("done", "error")
            finished += last == "done"
            cut += last == "error"
        if not clean:
            unclean += 1
            out.failures.append(f"stream {i} ended without a final event: {events[-1:]}")
    return finished, cut, unclean


@timed("sigterm")
async def sigterm(target: Target, long_streams: int = 10, short_streams: int = 4) -> Outcome:
    """SIGTERM while streams run: the process exits 0 within SERVE_DRAIN_TIMEOUT_S (plus process exit),
    every stream ends cleanly: `done`, or a final `error` event (`[DONE]` after an error chunk on the
    OpenAI route), never a bare cut. Consumes the server."""
    out = Outcome("sigterm")
    assert target.terminate is not None and target.wait_exit is not None
    drain = float(target.setting("SERVE_DRAIN_TIMEOUT_S", "30"))
    async with client(target.url, connections=long_streams + short_streams + 8, timeout=drain + 60) as http:
        generator = (await model_ids(http))["generation"]
        streams = _Streams(http, total=long_streams + short_streams + 2)
        max_new = int(target.setting("SERVE_MAX_NEW_TOKENS", "256")) - 16
        tasks = [asyncio.ensure_future(streams.generate(max_new)) for _ in range(long_streams)]
        tasks += [asyncio.ensure_future(streams.completion(generator, max_new)) for _ in range(2)]
        tasks += [asyncio.ensure_future(streams.generate(12)) for _ in range(short_streams)]
        await asyncio.wait_for(streams.all_started.wait(), 120)
        target.terminate()
        signalled = time.monotonic()
        await asyncio.sleep(0.2)
        refused = await http.post("/v1/generate", json={"prompt": "late", "max_new_tokens": 2})
        results = await asyncio.gather(*tasks)
        status = await asyncio.to_thread(target.wait_exit, drain + 30)
        exit_s = time.monotonic() - signalled
    finished, cut, unclean = _tally(out, results, openai=range(long_streams, long_streams + 2))
    out.figures = {
        "streams": len(results),
        "finished": finished,
        "cut_with_error_event": cut,
        "unclean": unclean,
        "drain_timeout_s": drain,
        "exit_after_s": round(exit_s, 2),
        "exit_status": status,
        "new_request_while_draining": refused.status_code,
    }
    out.check(status == 0, f"exit status {status}")
    out.check(exit_s <= drain + 3.0, f"exited {exit_s:.1f}s after SIGTERM; the drain timeout is {drain}s")
    out.check(refused.status_code == 503, f"a request after SIGTERM got {refused.status_code}, not 503")
    out.check(finished >= short_streams, f"only {finished} streams finished; the short ones should")
    return out
