"""A server that answers our API at once and does no work: the floor under the HTTP rows of
benchmarks/anchor.py.

    python -m benchmarks.http_floor --port 8000 [--dimensions 384]

uvicorn as the service runs it (httptools, uvloop, no access log) around a bare ASGI app: no framework, no
validation, no tokenizer, no model. It answers /v1/classify, /v1/translate, /v1/embeddings and /v1/generate (plain
or `stream: true`) with bodies of the shape and size ours sends, as many output tokens as the request asks
for, and a stream sends each token event on its own (yielding to the loop between them, as a server
whose tokens come a step at a time does). What this server reaches with the anchor's load generator is the
most any Python server behind uvicorn could answer on this machine if its model cost nothing; the anchor
turns it into a ceiling for ours / CTranslate2 (`ceiling_per_ct2`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

REPO = Path(__file__).resolve().parent.parent

JSON = [(b"content-type", b"application/json")]
STREAM = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
USAGE = {"prompt_tokens": 32, "completion_tokens": 0, "total_tokens": 0}


def classification() -> dict[str, Any]:
    scores = {"negative": 0.5453202329017908, "positive": 0.4546797670982093}
    return {"model": "classifier", "results": [{"label": "negative", "score": scores["negative"], "scores": scores,
                                                "input_tokens": 12}]}


def translation(tokens: int) -> dict[str, Any]:
    text = " ".join(["mot"] * tokens)
    return {"model": "translator", "translations": [{"text": text, "score": -0.219, "input_tokens": 20,
                                                     "output_tokens": tokens}]}


def generation(tokens: int) -> dict[str, Any]:
    usage = USAGE | {"completion_tokens": tokens, "total_tokens": USAGE["prompt_tokens"] + tokens}
    return {"model": "generator", "text": "H" * tokens, "finish_reason": "length", "usage": usage,
            "seed": 3856822353817456978}


EMBEDDING_DIMENSIONS = 384  # the served embedder's; --dimensions sets another


def embedding_vector(dimensions: int) -> list[float]:
    """A unit vector of float32 values, as long in JSON as a real embedding's."""
    vector = [((i * 7919) % 1000 - 500) / 1000 for i in range(dimensions)]
    norm = sum(v * v for v in vector) ** 0.5
    return [float(struct.unpack("f", struct.pack("f", v / norm))[0]) for v in vector]


def embeddings(request: dict[str, Any], vector: list[float]) -> dict[str, Any]:
    inputs = request["input"]
    count = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
    return {"object": "list", "model": "embedder",
            "data": [{"object": "embedding", "index": i, "embedding": vector} for i in range(count)],
            "usage": {"prompt_tokens": 12 * count, "total_tokens": 12 * count}}


VECTOR = [embedding_vector(EMBEDDING_DIMENSIONS)]  # set by --dimensions


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body) if body else {}
    path = scope["path"]
    if path == "/v1/generate" and request.get("stream"):
        await send({"type": "http.response.start", "status": 200, "headers": STREAM})
        for index in range(request["max_new_tokens"]):
            token = {"type": "token", "index": index, "id": 41, "text": "H", "special": False}
            await send({"type": "http.response.body", "body": event("token", token), "more_body": True})
            await asyncio.sleep(0)  # one event per write, as tokens that come a step at a time
        done = {"type": "done"} | generation(request["max_new_tokens"])
        await send({"type": "http.response.body", "body": event("done", done)})
        return
    status = 200
    if path == "/v1/generate":
        answer = generation(request["max_new_tokens"])
    elif path == "/v1/translate":
        answer = translation(request["max_new_tokens"])
    elif path == "/v1/classify":
        answer = classification()
    elif path == "/v1/embeddings":
        answer = embeddings(request, VECTOR[0])
    else:
        answer, status = {"error": {"type": "not_found", "message": path}}, 404
    data = json.dumps(answer, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON, (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dimensions", type=int, default=EMBEDDING_DIMENSIONS, help="the /v1/embeddings vector size")
    args = parser.parse_args()
    VECTOR[0] = embedding_vector(args.dimensions)
    uvicorn.run(app, host=args.host, port=args.port, http="httptools", loop="auto", access_log=False,
                log_level="warning")


class FloorServer:
    """This server in a subprocess, on `port`: a context manager that waits until it accepts connections."""

    def __init__(self, port: int, dimensions: int = EMBEDDING_DIMENSIONS) -> None:
        command = ["-m", "benchmarks.http_floor", "--port", str(port), "--dimensions", str(dimensions)]
        self.proc = subprocess.Popen([sys.executable, *command], cwd=REPO)
        self.port, self.url = port, f"http://127.0.0.1:{port}"

    def __enter__(self) -> FloorServer:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the floor server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("the floor server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


if __name__ == "__main__":
    main()
