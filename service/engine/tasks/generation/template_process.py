"""The parent's side of the chat-template sandbox (template_sandbox.py): one child process per
template, started on first use in each process (the front ends forked from the engine start their own),
asked one request at a time with a deadline. A child past its deadline (a template stuck in a loop) or gone
(killed for memory) is killed and replaced; the request that found it so gets a `SandboxFailure`.

`ask` blocks: callers on the event loop run it on a worker thread."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any

from service.engine.tasks.generation.template_sandbox import LIMIT

# Address space for the child: Python and Jinja take about 25 MB of it; the rest bounds what a template builds.
DEFAULT_MEMORY_BYTES = 512 << 20


@dataclass(frozen=True)
class SandboxRefusal(Exception):
    """The child answered with an error: its kind (template_sandbox's TEMPLATE_ERROR, UNSAFE, LIMIT,
    COMPILE) and message."""

    kind: str
    message: str


class TemplateProcess:
    """One template's child process: compiles the template once per child, renders on request."""

    def __init__(self, source: str, timeout_s: float, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self.source, self.timeout_s, self.memory_bytes = source, timeout_s, memory_bytes
        self._lock = threading.Lock()
        self._child: subprocess.Popen[str] | None = None
        self._owner = 0  # the pid that started the child: a forked process starts its own

    def render(self, variables: dict[str, Any], max_chars: int) -> str:
        """The rendered text; SandboxRefusal when the template refuses or hits a limit."""
        with self._lock:
            if self._child is None or self._owner != os.getpid():
                self._start()
            answer = self._ask({"op": "render", "key": "t", "variables": variables, "max_chars": max_chars})
        return str(answer["text"])

    def check(self) -> None:
        """Compile in a fresh child: SandboxRefusal when the template does not compile within the bounds."""
        with self._lock:
            self._start()

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _start(self) -> None:
        self._kill()
        env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
        command = [sys.executable, "-m", "service.engine.tasks.generation.template_sandbox", str(self.memory_bytes)]
        self._child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8", env=env
        )
        self._owner = os.getpid()
        try:
            self._ask({"op": "compile", "key": "t", "source": self.source}, timeout_s=max(self.timeout_s, 10.0))
        except SandboxRefusal:
            self._kill()
            raise

    def _ask(self, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        child = self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(json.dumps(request) + "\n")  # ASCII: a lone surrogate travels as its escape
            child.stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill()
            raise SandboxRefusal(LIMIT, "the template's sandbox process ended (out of memory)") from None
        line = self._read_line(child.stdout, self.timeout_s if timeout_s is None else timeout_s)
        if line is None:
            self._kill()
            raise SandboxRefusal(LIMIT, f"the template took longer than {timeout_s or self.timeout_s:g} s")
        if not line:
            self._kill()
            raise SandboxRefusal(LIMIT, "the template's sandbox process ended (out of memory)")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise SandboxRefusal(answer["error"], answer["message"])
        return answer

    @staticmethod
    def _read_line(stdout: IO[str], timeout_s: float) -> str | None:
        """One line, '' at the end of the stream, None past the deadline. The child answers each request with
        exactly one line, so a readable pipe means the line is coming."""
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        return stdout.readline() if ready else None

    def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None and self._owner == os.getpid():
            child.kill()
            child.wait()
