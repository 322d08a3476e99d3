"""The checks of `e2e.py drain`: SIGTERM to the container while streamed generations run; the server
drains (/ready and new requests 503, the in-flight gauge above 0) and every stream completes in full.
Standard library only."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy reads the repository as packages; the script imports its siblings from its own folder
    from harness.deploy.e2e_checks import Checks, error_type
    from harness.deploy.e2e_client import Client, docker_kill
else:
    from e2e_checks import Checks, error_type
    from e2e_client import Client, docker_kill


class Drain:
    """`cfg["streams"]` streamed generations (expectations.json's `drain`), each in a thread of its own, and
    the checks of what SIGTERM does to them."""

    def __init__(self, client: Client, cfg: dict[str, Any], container: str) -> None:
        self.client, self.cfg, self.container = client, cfg, container
        self.body = {"prompt": cfg["prompt"], "max_new_tokens": cfg["max_new_tokens"], "ignore_eos": True,
                     "temperature": 0.8, "seed": 7}
        self.started = threading.Barrier(cfg["streams"] + 1, timeout=60)
        # Each stream's (tokens, last event, its payload, when it came), or the exception that ended it.
        self.results: list[Any] = [None] * cfg["streams"]
        self.threads = [threading.Thread(target=self.stream, args=(i,), daemon=True) for i in range(cfg["streams"])]
        self.signalled: float | None = None

    def stream(self, i: int) -> None:
        tokens: list[dict[str, Any]] = []
        try:
            events = self.client.stream("/v1/generate", {**self.body, "stream": True})
            for event, data in events:
                payload = json.loads(data)
                if event == "token":
                    tokens.append(payload)
                    if len(tokens) == 1:
                        self.started.wait()  # every stream is in flight before the signal goes out
                else:
                    self.results[i] = (tokens, event, payload, time.monotonic())
        except urllib.error.HTTPError as exc:
            self.results[i] = AssertionError(f"HTTP {exc.code}: {exc.read()[:300]!r}")
            self.started.abort()
        except Exception as exc:
            self.results[i] = exc
            self.started.abort()

    def signal(self) -> str:
        try:
            self.started.wait()
        except threading.BrokenBarrierError:
            errors = [r for r in self.results if isinstance(r, Exception)]
            raise AssertionError(f"a stream failed before the signal: {errors[0] if errors else 'timeout'}") from None
        self.signalled = time.monotonic()
        docker_kill(self.container, "SIGTERM")
        return f"{self.cfg['streams']} streams in flight, SIGTERM sent"

    def draining(self) -> str:
        deadline = time.monotonic() + 5
        while True:  # the signal handler runs on the server's next loop tick
            ready = self.client.get("/ready")
            if ready.status == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert ready.status == 503 and ready.json()["status"] == "draining", (ready.status, ready.body)
        gauge = re.search(r"^serve_inflight_requests (\S+)", self.client.get("/metrics").text, re.MULTILINE)
        inflight = float(gauge.group(1)) if gauge else 0.0
        refused = self.client.post("/v1/classify", {"text": "a new request during the drain"})
        assert refused.status == 503, f"new request during drain: HTTP {refused.status}"
        assert inflight >= 1, (
            "no request in flight after SIGTERM: the generations ended before the signal; "
            "raise drain.max_new_tokens or drain.streams in expectations.json"
        )
        return f"/ready 503 draining, new request 503 {error_type(refused)}, {inflight:.0f} in flight"

    def completed(self) -> str:
        assert self.signalled is not None
        for t in self.threads:
            t.join(timeout=120)
        last = 0.0
        for i, result in enumerate(self.results):
            assert not isinstance(result, Exception), f"stream {i}: {result!r}"
            assert result is not None, f"stream {i} did not finish"
            tokens, event, payload, at = result
            assert event == "done", f"stream {i} ended with {event}: {payload}"
            assert payload["finish_reason"] == "length", payload
            assert len(tokens) == payload["usage"]["completion_tokens"] == self.cfg["max_new_tokens"], len(tokens)
            last = max(last, at)
        after = last - self.signalled
        return f"every stream got all {self.cfg['max_new_tokens']} tokens, the last {after:.2f}s after SIGTERM"


def check_drain(client: Client, exp: dict[str, Any], container: str) -> int:
    checks = Checks()
    drain = Drain(client, exp["drain"], container)
    for t in drain.threads:
        t.start()
    checks.run("SIGTERM during generation", drain.signal)
    if drain.signalled is not None:
        checks.run("server drains", drain.draining)
        checks.run("in-flight generations complete", drain.completed)
    return checks.finish()
