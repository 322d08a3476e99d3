"""The HTTP side of the container end-to-end checks (harness/deploy/e2e.py, scale.py): a small client with
server-sent events, the two streamed routes read to their end, and Docker's kill. Standard library only."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


class Client:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _request(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> urllib.request.Request:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + path, data=data, method=method, headers=headers)

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Reply:
        try:
            with urllib.request.urlopen(self._request(method, path, body, raw), timeout=self.timeout) as r:
                return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
        except urllib.error.HTTPError as e:
            return Reply(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())

    def get(self, path: str) -> Reply:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> Reply:
        return self.call("POST", path, body)

    def stream(self, path: str, body: Any) -> Iterator[tuple[str | None, str]]:
        """Server-sent events as (event name or None, data), read as they arrive."""
        with urllib.request.urlopen(self._request("POST", path, body), timeout=self.timeout) as r:
            ctype = r.headers.get("content-type", "")
            assert ctype.startswith("text/event-stream"), f"{path}: content-type {ctype!r}"
            event: str | None = None
            data: list[str] = []
            for raw_line in r:
                line = raw_line.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, "\n".join(data)
                    event, data = None, []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))


def docker_kill(container: str, signal: str = "SIGTERM") -> None:
    """POST /containers/{id}/kill on the engine's socket (DOCKER_HOST, else Docker's default): `docker kill
    --signal` without a CLI start-up; the CLI (DOCKER) for an engine that is not a local socket."""
    host = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    path = host.removeprefix("unix://")
    if not host.startswith("unix://") or not os.path.exists(path):
        docker = os.environ.get("DOCKER", "docker")
        subprocess.run([docker, "kill", "--signal", signal, container], check=True, capture_output=True, timeout=30)
        return

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)

    conn = UnixConnection("localhost", timeout=10)
    conn.request("POST", f"/containers/{container}/kill?signal={signal}")
    response = conn.getresponse()
    assert response.status == 204, f"docker kill: {response.status} {response.read()!r}"
    conn.close()



def collect_generate_stream(client: Client, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tokens: list[dict[str, Any]] = []
    done: dict[str, Any] | None = None
    for event, data in client.stream("/v1/generate", {**body, "stream": True}):
        payload = json.loads(data)
        assert event in ("token", "done"), f"unexpected event {event}: {data}"
        assert done is None, f"event after done: {data}"
        if event == "token":
            assert payload["index"] == len(tokens), f"token index {payload['index']} != {len(tokens)}"
            tokens.append(payload)
        else:
            done = payload
    assert done is not None, "stream ended without a done event"
    return tokens, done


def collect_completion_stream(client: Client, body: dict[str, Any]) -> tuple[str, str | None]:
    text, finish, ended = "", None, False
    for _, data in client.stream("/v1/completions", {**body, "stream": True}):
        assert not ended, f"data after [DONE]: {data}"
        if data == "[DONE]":
            ended = True
            continue
        chunk = json.loads(data)
        assert chunk["object"] == "text_completion", chunk
        for choice in chunk["choices"]:
            text += choice["text"]
            finish = choice["finish_reason"] or finish
    assert ended, "stream did not end with data: [DONE]"
    return text, finish
