"""The transport with slow and stuck clients: bodies that trickle in, the keep-alive idle boundary that
clients' connection pools race, streams whose client never reads, and SIGTERM while clients neither read
their answers nor finish sending.
Raw sockets (asyncio streams): an HTTP client library would not misbehave this way on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import time
from typing import Any

import httpx

from harness.reliability.harness import Outcome, Target, client, is_error_shape, metric, model_ids, timed
from harness.reliability.traffic import _gauges

# The sections' server: a body timeout short enough to wait for, longer than the drain (so the slow uploads
# of stuck_drain are still mid-body when it ends), and the drain of the probe that found the overrun.
TRANSPORT_SETTINGS = {"SERVE_BODY_TIMEOUT_S": "4", "SERVE_DRAIN_TIMEOUT_S": "3"}
# stuck_readers' server: a send timeout short enough to wait for (on the server above it would cut
# stuck_drain's unread streams before its SIGTERM).
SEND_TIMEOUT_SETTINGS = {"SERVE_SEND_TIMEOUT_S": "1"}
# httpx drops pooled connections idle for 5 s (uvicorn's old keep-alive timeout, to the same instant):
# a connection idle a little longer must still take a request.
IDLE_S = 5.5
# How much later than due a loaded 2-core machine may answer or close.
SLACK_S = 2.0
TRICKLE_S = 0.2  # one body byte this often


def _address(target: Target) -> tuple[str, int]:
    url = httpx.URL(target.url)
    return url.host, url.port or 80


def _request(method: str, path: str, body: bytes = b"", length: int | None = None, request_id: str = "") -> bytes:
    declared = len(body) if length is None else length
    extra = f"X-Request-Id: {request_id}\r\n" if request_id else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {declared}\r\n\r\n"
    )
    return head.encode() + body


def _post(path: str, body: dict[str, Any], request_id: str = "") -> bytes:
    return _request("POST", path, json.dumps(body).encode(), request_id=request_id)


async def _reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response read by its content-length: (status, headers, body)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head.strip().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split(" ")[1]), headers, body


async def _trickle(writer: asyncio.StreamWriter) -> None:
    """Send a space now and then, until the server closes the connection."""
    with contextlib.suppress(OSError):
        while not writer.is_closing():
            await asyncio.sleep(TRICKLE_S)
            writer.write(b" ")
            await writer.drain()


async def _closed_after(reader: asyncio.StreamReader, started: float, limit: float) -> float | None:
    """Seconds from `started` until the server closed the connection (None: still open at `limit`)."""
    with contextlib.suppress(OSError):
        try:
            while await asyncio.wait_for(reader.read(4096), limit - (time.monotonic() - started)):
                pass
        except TimeoutError:
            return None
    return time.monotonic() - started


async def _slow_body(address: tuple[str, int], method: str, path: str, limit: float) -> dict[str, Any]:
    """A header, then a 1,000-byte body one byte at a time: the reply, when it came, and when the server
    closed the connection."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(_request(method, path, b"{", length=1000))
    started = time.monotonic()
    trickle = asyncio.ensure_future(_trickle(writer))
    result: dict[str, Any] = {"status": None, "answered_s": None, "closed_s": None}
    try:
        try:
            status, headers, body = await asyncio.wait_for(_reply(reader), limit)
        except (TimeoutError, asyncio.IncompleteReadError, OSError) as exc:
            result["error"] = type(exc).__name__
            return result
        result |= {"status": status, "answered_s": time.monotonic() - started, "headers": headers}
        with contextlib.suppress(ValueError):
            result["body"] = json.loads(body)
        result["closed_s"] = await _closed_after(reader, started, limit)
        return result
    finally:
        trickle.cancel()
        writer.close()


async def _idle_then_again(address: tuple[str, int], request: bytes, idle_s: float) -> list[str]:
    """The same request twice on one connection, `idle_s` apart: each status, or how the connection failed."""
    reader, writer = await asyncio.open_connection(*address)
    statuses = []
    try:
        for i in range(2):
            if i:
                await asyncio.sleep(idle_s)
            try:
                writer.write(request)
                await writer.drain()
                statuses.append(str((await asyncio.wait_for(_reply(reader), 60))[0]))
            except (TimeoutError, asyncio.IncompleteReadError, OSError) as exc:
                statuses.append(type(exc).__name__)
                break
    finally:
        writer.close()
    return statuses


@timed("slow_clients")
async def slow_clients(target: Target, clients: int = 16) -> Outcome:
    """Bodies trickling in one byte at a time: 408 in the error shape at SERVE_BODY_TIMEOUT_S, the
    connection closed and the in-flight slot freed; a body still trickling after the request was answered
    without it: closed at the same deadline; a keep-alive connection idle past httpx's pool expiry still
    takes a POST."""
    out = Outcome("slow_clients")
    body_timeout = float(target.setting("SERVE_BODY_TIMEOUT_S", "30"))
    limit = body_timeout + SLACK_S
    address = _address(target)
    async with client(target.url, connections=4) as http:
        classify = _post("/v1/classify", {"text": "A wonderful, moving film."})
        keepalive = asyncio.ensure_future(_idle_then_again(address, classify, IDLE_S))
        slow = [asyncio.ensure_future(_slow_body(address, "POST", "/v1/generate", limit)) for _ in range(clients)]
        answered = asyncio.ensure_future(_slow_body(address, "GET", "/health", limit))
        await asyncio.sleep(body_timeout / 2)
        held = metric((await http.get("/metrics")).text, "serve_inflight_requests")
        results = await asyncio.gather(*slow)
        freed_at = time.monotonic()
        inflight = held
        while inflight and time.monotonic() - freed_at < SLACK_S:
            inflight = metric((await http.get("/metrics")).text, "serve_inflight_requests")
            await asyncio.sleep(0.05)
        early = await answered
        idle = await keepalive
    timed_out = [
        r for r in results
        if r["status"] == 408 and is_error_shape(r.get("body")) and r["body"]["error"]["type"] == "request_timeout"
    ]
    answer_s = [r["answered_s"] for r in results if r["answered_s"] is not None]
    closed = [r for r in results if r["closed_s"] is not None]
    out.figures = {
        "slow_bodies": clients,
        "in_flight_while_sending": held,
        "got_408": len(timed_out),
        "answered_after_s": [round(min(answer_s), 2), round(max(answer_s), 2)] if answer_s else None,
        "closed": len(closed),
        "in_flight_after": inflight,
        "body_timeout_s": body_timeout,
        "answered_without_body_closed_after_s": round(early["closed_s"], 2) if early["closed_s"] else None,
        "idle_s": IDLE_S,
        "keepalive_statuses": idle,
    }
    out.check(held >= clients, f"{held} requests in flight while {clients} bodies trickled in")
    out.check(len(timed_out) == clients, f"{len(timed_out)} of {clients} slow bodies got a 408 request_timeout: "
              f"{[r.get('status') or r.get('error') for r in results if r not in timed_out][:4]}")
    out.check(all(r.get("headers", {}).get("connection") == "close" for r in timed_out), "a 408 kept the connection")
    out.check(all(body_timeout * 0.9 <= s <= limit for s in answer_s), f"408s came after {answer_s[:4]} s "
              f"(SERVE_BODY_TIMEOUT_S {body_timeout})")
    out.check(len(closed) == clients, f"{clients - len(closed)} slow-body connections still open after {limit} s")
    out.check(inflight == 0, f"{inflight} requests still in flight after the 408s")
    out.check(early["status"] == 200, f"GET /health with a slow body got {early.get('status') or early.get('error')}")
    out.check(early["closed_s"] is not None, f"a body trickling in after its answer held the connection {limit} s")
    out.check(idle == ["200", "200"], f"a POST after {IDLE_S} s idle on a keep-alive connection: {idle}")
    return out


# --- SIGTERM with stuck clients -----------------------------------------------------------------------

# A large answer that nobody reads fills the socket buffers (about 2 MB on loopback, even with a tiny
# receive buffer), so a stream pipelined behind it on the same connection blocks in its first send.
BIG_ANSWER_BYTES = 5_000_000


async def _stuck_reader(address: tuple[str, int], requests: bytes) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, address)
    await loop.sock_sendall(sock, requests)
    return sock


def _classified(metrics: httpx.Response) -> float:
    return metric(metrics.text, "serve_requests_total", endpoint="/v1/classify", status="200")


async def _unread_answer(http: httpx.AsyncClient, target: Target, out: Outcome) -> bytes | None:
    """A /v1/classify request whose answer (with attention maps) is about BIG_ANSWER_BYTES: unread, it
    fills the socket buffers, so a request pipelined behind it blocks in its first send. None (and a
    failure in `out`) if the server cannot make one."""
    ids = await model_ids(http)
    if not {"classification", "generation"} <= set(ids):
        out.failures.append(f"needs a classifier and a generator; served: {sorted(ids)}")
        return None
    text = " ".join(["a very long and quite repetitive review of a film"] * 10)
    one = await http.post("/v1/classify", json={"text": text, "return_attention": True})
    if one.status_code != 200:
        out.failures.append(f"the attention probe got {one.status_code}: {one.text[:200]}")
        return None
    result = one.json()["results"][0]  # attention: [layer][head][token][token]
    layers = result["attention"]["layers"]
    values = len(layers) * len(layers[0]) * result["input_tokens"] ** 2
    allowed = int(target.setting("SERVE_MAX_ATTENTION_VALUES", "1048576")) // values
    count = min(allowed, math.ceil(BIG_ANSWER_BYTES / len(one.content)))
    out.figures["big_answer_texts"] = count
    return _post("/v1/classify", {"text": [text] * count, "return_attention": True})


async def _stuck_streams(http: httpx.AsyncClient, address: tuple[str, int], big: bytes, request_ids: list[str],
                         max_new_tokens: int, readers: list[socket.socket]) -> float:
    """A stream of `max_new_tokens` per request id ("": none), each on a connection of its own behind the
    unread `big` answer; their sockets go into `readers`. Returns the classify answers counted before them."""
    body = {"prompt": "Once", "max_new_tokens": max_new_tokens, "ignore_eos": True, "stream": True}
    answered = _classified(await http.get("/metrics"))
    for request_id in request_ids:
        readers.append(await _stuck_reader(address, big + _post("/v1/generate", body, request_id)))
    return answered


async def _until_classified(http: httpx.AsyncClient, count: float, poll_s: float) -> None:
    """Until `count` classify answers are counted, or 60 s. A stream starts when the answer before it is
    written out (and counted), and its first send waits."""
    deadline = time.monotonic() + 60
    while _classified(await http.get("/metrics")) < count and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)


async def _server_closed(sock: socket.socket, limit: float) -> bool:
    """Whether the server closes (or resets) the connection within `limit` s; what it sent is read and dropped."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + limit
    try:
        while await asyncio.wait_for(loop.sock_recv(sock, 65536), max(0.0, deadline - time.monotonic())):
            pass
    except TimeoutError:
        return False
    except OSError:  # reset: the abort
        pass
    return True


@timed("stuck_readers")
async def stuck_readers(target: Target, streams: int = 4) -> Outcome:
    """Streams whose client never reads, each waiting in a send on full socket buffers: at
    SERVE_SEND_TIMEOUT_S each is ended as if its client had gone away. The in-flight slots are freed and
    the gauges back at 0 within the timeout + 1 s, the connections closed, one warning per stream naming
    its request id, no traceback."""
    out = Outcome("stuck_readers")
    timeout = float(target.setting("SERVE_SEND_TIMEOUT_S", "60"))
    limit = timeout + 1.0
    address = _address(target)
    request_ids = [f"stuck-reader-{i}" for i in range(streams)]
    readers: list[socket.socket] = []
    try:
        async with client(target.url, connections=4) as http:
            big = await _unread_answer(http, target, out)
            if big is None:
                return out
            answered = await _stuck_streams(http, address, big, request_ids, 240, readers)
            await _until_classified(http, answered + streams, poll_s=0.02)
            blocked = time.monotonic()
            held = metric((await http.get("/metrics")).text, "serve_inflight_requests")
            left = await _gauges(http)
            while left and time.monotonic() - blocked < limit + SLACK_S:  # past the limit too: how late, if late
                await asyncio.sleep(0.05)
                left = await _gauges(http)
            freed_s = time.monotonic() - blocked
            closed = await asyncio.gather(*(_server_closed(sock, SLACK_S) for sock in readers))
    finally:
        for sock in readers:
            sock.close()
    log = target.stderr()
    lines = log.splitlines()
    warned = {i: sum("SERVE_SEND_TIMEOUT_S" in line for line in lines if f"[{i}]" in line) for i in request_ids}
    tracebacks = log.count("Traceback") + log.count("Exception in ASGI application")
    out.figures |= {
        "stuck_streams": streams,
        "send_timeout_s": timeout,
        "in_flight_while_stuck": held,
        "gauges_zero_after_s": round(freed_s, 2) if not left else None,
        "left": left,
        "closed": sum(closed),
        "warned": sum(n == 1 for n in warned.values()),
        "tracebacks": tracebacks,
    }
    out.check(held >= streams, f"only {held} of {streams} unread streams were in flight")
    out.check(not left and freed_s <= limit, f"gauges at {left} {freed_s:.2f} s after the streams blocked "
              f"(SERVE_SEND_TIMEOUT_S {timeout}: due within {limit} s)")
    out.check(all(closed), f"{streams - sum(closed)} unread connections still open")
    if target.pid is not None:  # a server of ours: its log is at hand
        out.check(all(n == 1 for n in warned.values()), f"warnings per request id: {warned}")
        out.check(tracebacks == 0, f"the server logged {tracebacks} tracebacks")
    return out


@timed("stuck_drain")
async def stuck_drain(target: Target, streams: int = 4, uploads: int = 4) -> Outcome:
    """SIGTERM while streams' clients never read (their sends wait on full socket buffers) and uploads
    still trickle in: exit 0 within SERVE_DRAIN_TIMEOUT_S + 0.5 s, and no traceback in the server's log.
    Consumes the server."""
    out = Outcome("stuck_drain")
    assert target.terminate is not None and target.wait_exit is not None
    drain = float(target.setting("SERVE_DRAIN_TIMEOUT_S", "30"))
    address = _address(target)
    readers: list[socket.socket] = []
    writers: list[asyncio.StreamWriter] = []
    trickles: list[asyncio.Future[None]] = []
    try:
        async with client(target.url, connections=4) as http:
            big = await _unread_answer(http, target, out)
            if big is None:
                return out
            answered = await _stuck_streams(http, address, big, [""] * streams, 8, readers)
            for _ in range(uploads):
                _reader, writer = await asyncio.open_connection(*address)
                writer.write(_request("POST", "/v1/generate", b"{", length=100_000))
                writers.append(writer)
                trickles.append(asyncio.ensure_future(_trickle(writer)))
            await _until_classified(http, answered + streams, poll_s=0.05)
            await asyncio.sleep(1.0)  # a stream of 8 tokens whose sends did not block is over by now
            held = metric((await http.get("/metrics")).text, "serve_inflight_requests")
        target.terminate()
        signalled = time.monotonic()
        status = await asyncio.to_thread(target.wait_exit, drain + 30)
        exit_s = time.monotonic() - signalled
    finally:
        for trickle in trickles:
            trickle.cancel()
        for writer in writers:
            writer.close()
        for sock in readers:
            sock.close()
    log = target.stderr()
    tracebacks = log.count("Traceback")
    asgi_errors = log.count("Exception in ASGI application")  # uvicorn's line for a request it cancelled
    out.figures |= {
        "stuck_streams": streams,
        "slow_uploads": uploads,
        "in_flight_at_sigterm": held,
        "drain_timeout_s": drain,
        "exit_after_s": round(exit_s, 2),
        "exit_status": status,
        "tracebacks": tracebacks,
        "asgi_errors": asgi_errors,
    }
    out.check(held >= streams + uploads, f"only {held} of {streams + uploads} stuck requests were in flight")
    out.check(status == 0, f"exit status {status}")
    out.check(exit_s <= drain + 0.5, f"exited {exit_s:.2f}s after SIGTERM; the drain timeout is {drain}s")
    out.check(tracebacks == asgi_errors == 0, f"the server logged {tracebacks} tracebacks, {asgi_errors} "
              "'Exception in ASGI application'")
    return out
