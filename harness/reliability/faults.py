"""Faults: SIGTERM under load, broken and mismatched artifacts, and (in-process, so the engine can be
reached) an ONNX Runtime failure mid-batch, a bug inside a request, and slow-header clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harness.reliability.harness import (
    ARTIFACTS,
    REPO,
    Outcome,
    Target,
    client,
    free_port,
    is_error_shape,
    iter_sse,
    metric,
    model_ids,
    sse_events,
    timed,
)

# --- faults: SIGTERM under load -----------------------------------------------------------------------


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
        first = asyncio.Event()
        counted = 0
        total = long_streams + short_streams + 2

        async def stream(path: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
            nonlocal counted
            events: list[tuple[str, str]] = []
            try:
                async with http.stream("POST", path, json=body | {"stream": True, "ignore_eos": True}) as response:
                    if response.status_code != 200:
                        return f"status {response.status_code}", events
                    async for event in iter_sse(response):
                        if not events:
                            counted += 1
                            if counted == total:
                                first.set()
                        events.append(event)
            except httpx.HTTPError as exc:
                return f"transport error {type(exc).__name__}", events
            return "ok", events

        def generate(max_new: int) -> Any:
            return stream("/v1/generate", {"prompt": "Once", "max_new_tokens": max_new})

        def completion(max_new: int) -> Any:
            return stream("/v1/completions", {"model": generator, "prompt": "Once", "max_tokens": max_new})

        max_new = int(target.setting("SERVE_MAX_NEW_TOKENS", "256")) - 16
        tasks = [asyncio.ensure_future(generate(max_new)) for _ in range(long_streams)]
        tasks += [asyncio.ensure_future(completion(max_new)) for _ in range(2)]
        tasks += [asyncio.ensure_future(generate(12)) for _ in range(short_streams)]
        await asyncio.wait_for(first.wait(), 120)
        target.terminate()
        signalled = time.monotonic()
        await asyncio.sleep(0.2)
        refused = await http.post("/v1/generate", json={"prompt": "late", "max_new_tokens": 2})
        results = await asyncio.gather(*tasks)
        status = await asyncio.to_thread(target.wait_exit, drain + 30)
        exit_s = time.monotonic() - signalled
    finished = cut = unclean = 0
    for i, (how, events) in enumerate(results):
        openai = long_streams <= i < long_streams + 2
        if how != "ok":
            unclean += 1
            out.failures.append(f"stream {i}: {how}")
            continue
        if openai:
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


# --- faults: corrupt and mismatched artifacts ---------------------------------------------------------


def _edit_config(**changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        for key, value in changes.items():
            (config["dims"] if key in ("n_heads", "d_head", "n_layers") else config)[key] = value
        path.unlink()
        path.write_text(json.dumps(config))

    return edit


def _replace(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).unlink()
        (folder / name).write_bytes(content(data))

    return edit


def _edit_json(name: str, change: Callable[[Any], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).unlink()
        (folder / name).write_text(json.dumps(data))

    return edit


def _copy_from(other: str, name: str) -> Callable[[Path], None]:
    """Another model's file: the three trained models share their vocabulary size (8,000)."""

    def edit(folder: Path) -> None:
        (folder / name).unlink()
        shutil.copyfile(ARTIFACTS / other / name, folder / name)

    return edit


def _flip_bytes(data: bytes) -> bytes:
    """4 KiB in the middle of a graph inverted: inside its weights, so the file still loads and runs."""
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 4096]) + data[middle + 4096 :]


ARTIFACT_CASES: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("vocab_size 4000 on an 8,000-token model", "generator", _edit_config(vocab_size=4000), "config.json"),
    ("vocab_size 9000", "generator", _edit_config(vocab_size=9000), "config.json"),
    ("max_positions 100000", "generator", _edit_config(max_positions=100000), "config.json"),
    ("wrong n_heads", "generator", _edit_config(n_heads=8), "config.json"),
    ("wrong d_head", "generator", _edit_config(d_head=32), "config.json"),
    ("wrong n_layers", "classifier", _edit_config(n_layers=2), "config.json"),
    ("classifier vocab_size too large", "classifier", _edit_config(vocab_size=9000), "config.json"),
    ("translator max_positions too large", "translator", _edit_config(max_positions=100000), "config.json"),
    ("config.json not JSON", "translator", _replace("config.json", lambda b: b[:100]), "config.json"),
    ("broken tokenizer.json", "generator", _replace("tokenizer.json", lambda b: b[: len(b) // 2]), "tokenizer.json"),
    ("truncated graph", "classifier", _replace("encoder.onnx", lambda b: b[: len(b) // 3]), "encoder.onnx"),
    ("graph replaced by zeros", "generator", _replace("decoder.onnx", lambda b: bytes(1000)), "decoder.onnx"),
    # What the graphs cannot show: each loaded and served wrong answers before golden.json recorded the
    # tokenizer, the config and the graph files (contract/golden.py).
    ("the generator's tokenizer, same size", "translator", _copy_from("generator", "tokenizer.json"), "tokenizer.json"),
    ("the translator's tokenizer, same size", "classifier", _copy_from("translator", "tokenizer.json"),
     "tokenizer.json"),
    ("the classifier's tokenizer, same size", "generator", _copy_from("classifier", "tokenizer.json"),
     "tokenizer.json"),
    ("tokenizer adds no end token", "translator", _edit_json("tokenizer.json", lambda t: t.update(post_processor=None)),
     "tokenizer.json"),
    ("bos and eos swapped", "translator", _edit_json("config.json", lambda c: c["special_tokens"].update(bos=3, eos=2)),
     "config.json"),
    ("eos is the pad token", "generator", _edit_json("config.json", lambda c: c["special_tokens"].update(eos=0, bos=0)),
     "config.json"),
    ("labels reversed", "classifier", _edit_json("config.json", lambda c: c.update(labels=c["labels"][::-1])),
     "config.json"),
    ("max_positions halved", "generator", _edit_json("config.json", lambda c: c.update(max_positions=128)),
     "config.json"),
    ("weights changed in place", "classifier", _replace("encoder.onnx", _flip_bytes), "encoder.onnx"),
    ("golden.json not JSON", "translator", _replace("golden.json", lambda b: b[:100]), "golden.json"),
]


def _broken_copy(root: Path, model: str, edit: Callable[[Path], None]) -> None:
    """Graphs are linked, not copied (edits replace a file before writing it)."""
    folder = root / model
    folder.mkdir(parents=True)
    for item in (ARTIFACTS / model).iterdir():
        if item.suffix == ".onnx":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    edit(folder)


@timed("artifacts")
async def artifacts() -> Outcome:
    """Each broken artifact: the server exits non-zero with one line naming the file, no traceback."""
    out = Outcome("artifacts")
    times = []
    for name, model, edit, file in ARTIFACT_CASES:
        with tempfile.TemporaryDirectory() as root:
            _broken_copy(Path(root), model, edit)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
            env |= {"SERVE_ARTIFACTS_DIR": root, "SERVE_MODELS": model, "SERVE_PORT": str(free_port())}
            env |= {"SERVE_HOST": "127.0.0.1", "SERVE_INTRA_OP_THREADS": "1", "SERVE_LOG_LEVEL": "warning"}
            started = time.perf_counter()
            proc = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "service"],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            times.append(time.perf_counter() - started)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            last = lines[-1] if lines else ""
            out.check(proc.returncode not in (0, None), f"{name}: exit status {proc.returncode}")
            out.check(str(Path(root) / model / file) in last, f"{name}: the last line does not name {file}: {last!r}")
            out.check("Traceback" not in proc.stderr, f"{name}: a traceback instead of one line")
    out.figures = {"cases": len(ARTIFACT_CASES), "max_exit_s": round(max(times), 2)}
    return out


# --- faults in-process: an ORT failure mid-batch, an internal error, slow headers ---------------------


class _InProcessServer:
    """The app under uvicorn in a thread of this process, so a test can reach into its engine."""

    def __init__(self, **overrides: Any) -> None:
        import uvicorn

        from service.app import create_app
        from service.server import server_config
        from service.settings import Settings

        values: dict[str, Any] = {
            "artifacts_dir": ARTIFACTS, "intra_op_threads": 1, "inter_op_threads": 1, "max_new_tokens": 240,
        }
        self.settings = Settings(**(values | overrides))
        self.app = create_app(self.settings)
        self.port = free_port()
        config = server_config(self.app, self.settings, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("the in-process server did not become ready")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _raw_exchange(port: int, requests: list[bytes], timeout: float = 30) -> list[bytes]:
    """Send requests one after another on ONE connection; return each raw response (by content-length)."""
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        reader = sock.makefile("rb")
        for request in requests:
            sock.sendall(request)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = reader.read(1)
                if not byte:
                    answers.append(head)
                    return answers
                head += byte
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            answers.append(head + reader.read(length))
    return answers


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))


@timed("faults")
async def faults() -> Outcome:
    """An ORT failure in the middle of a decode step; a bug inside a request; a slowloris client."""
    out = Outcome("faults")
    secret = "SECRET-PROMPT-7f3a"
    capture = _Capture()
    capture.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logging.getLogger().addHandler(capture)
    try:
        with _InProcessServer(models=["generator", "classifier"], header_timeout_s=1.0, warmup=False) as srv:
            engine = srv.app.state.engine
            # 1. ORT fails once in a decode step while 6 streams and 4 plain requests share the batch.
            session = engine.generator.model.session
            original = session.run
            armed = threading.Event()
            fired = threading.Event()

            def failing_run(*args: Any, **kwargs: Any) -> Any:
                if armed.is_set() and not fired.is_set():
                    fired.set()
                    raise RuntimeError("injected ONNX Runtime failure")
                return original(*args, **kwargs)

            session.run = failing_run
            async with client(srv.url, connections=16) as http:
                body = {"prompt": "Once", "max_new_tokens": 200, "ignore_eos": True}  # still running when armed

                async def stream() -> list[tuple[str, str]]:
                    async with http.stream("POST", "/v1/generate", json=body | {"stream": True}) as response:
                        return await sse_events(response)

                waiters: list[asyncio.Future[list[tuple[str, str]] | httpx.Response]]
                waiters = [asyncio.ensure_future(stream()) for _ in range(6)]
                waiters += [asyncio.ensure_future(http.post("/v1/generate", json=body)) for _ in range(4)]
                for _ in range(200):
                    if metric((await http.get("/metrics")).text, "serve_running_sequences") >= 10:
                        break
                    await asyncio.sleep(0.02)
                armed.set()
                results = await asyncio.gather(*waiters)
                got_error = 0
                for result in results:
                    if isinstance(result, httpx.Response):
                        got_error += result.status_code == 500 and is_error_shape(result.json())
                    else:
                        got_error += bool(result) and result[-1][0] == "error"
                after = await http.post("/v1/generate", json={"prompt": "after", "max_new_tokens": 3})
                health = await http.get("/health")
            out.figures["ort_failure_waiters"] = len(results)
            out.figures["ort_failure_errors"] = got_error
            out.check(fired.is_set(), "the injected failure never fired")
            out.check(got_error == len(results), f"{got_error} of {len(results)} waiters got an error")
            out.check(after.status_code == 200 and health.status_code == 200, "the server did not recover")

            # 2. A bug inside a request: JSON 500, the keep-alive connection stays usable, no request text logged.
            def buggy(inputs: Any, *args: Any, **kwargs: Any) -> Any:
                raise ValueError(f"cannot handle {inputs}")

            engine.classifier.tokenize = buggy
            request = json.dumps({"text": secret}).encode()
            post = (
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(request)).encode() + b"\r\n\r\n" + request
            )
            get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            answers = await asyncio.to_thread(_raw_exchange, srv.port, [post, get, post, get])
            statuses = [a.split(b" ", 2)[1].decode() if a else "none" for a in answers]
            out.figures["internal_error_then_keepalive"] = statuses
            out.check(statuses == ["500", "200", "500", "200"], f"one connection answered {statuses}")
            out.check(b'"internal_error"' in answers[0], f"the 500 is not our JSON: {answers[0][:300]!r}")
            out.check(b"connection: close" not in answers[0].lower(), "the 500 closed the connection")
            logged = "\n".join(capture.text)
            out.check(secret not in logged, "the request's text is in the log")
            out.check("internal error (ValueError)" in logged, "the internal error was not logged")

            # 3. Slow headers: a client that sends one byte per second, and one that sends nothing.
            def slowloris() -> tuple[float, bytes]:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                    started = time.monotonic()
                    reply = b""
                    with contextlib.suppress(OSError):
                        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n":
                            sock.sendall(bytes([byte]))
                            time.sleep(0.25)
                    with contextlib.suppress(OSError):
                        reply = sock.recv(4096)
                        while chunk := sock.recv(4096):
                            reply += chunk
                    return time.monotonic() - started, reply

            def silent() -> float:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                    started = time.monotonic()
                    with contextlib.suppress(OSError):
                        while sock.recv(4096):
                            pass
                    return time.monotonic() - started

            slow_s, reply = await asyncio.to_thread(slowloris)
            silent_s = await asyncio.to_thread(silent)
            out.figures["slow_header_closed_after_s"] = round(slow_s, 2)
            out.figures["silent_connection_closed_after_s"] = round(silent_s, 2)
            out.check(b" 408 " in reply[:20], f"slow headers got {reply[:60]!r}, not 408")
            out.check(
                slow_s < 3 and silent_s < 3, f"slow connections held {slow_s:.1f}s / {silent_s:.1f}s (timeout 1 s)"
            )
    finally:
        logging.getLogger().removeHandler(capture)
    return out
