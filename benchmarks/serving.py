"""Benchmark the inference service end to end.

    python -m benchmarks.serving [--artifacts artifacts] [--threads 0] [--scale 1.0] [--out bench_results]

Starts `python -m service` on a free port and drives it with concurrent HTTP clients: requests/s,
tokens/s, p50/p99 latency and time to first token at concurrency 1, 8 and 32 for each endpoint.
Then, side by side in the same run:
  - dynamic batching on vs off (SERVE_MAX_BATCH_SIZE=1): classify throughput at concurrency 32,
  - continuous batching vs one sequence at a time: generated tokens/s with 16 concurrent streams,
  - KV-cache decoding vs recomputing the prefix every step (generator graph, in process).
Prints a Markdown table and writes the JSON to <out>/bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from harness.reliability.harness import wait_until_ready
from service.runtime.artifact import load_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = (1, 8, 32)
TEXT = "The committee approved the new budget after a long debate about schools and roads."
PROMPT = "Once upon a time, in a small village by the sea,"


@dataclass
class Cell:
    """One endpoint at one concurrency."""

    endpoint: str
    concurrency: int
    requests: int
    seconds: float
    latencies: list[float] = field(default_factory=list, repr=False)
    ttfts: list[float] = field(default_factory=list, repr=False)
    tokens: int = 0
    errors: int = 0
    server_cores: float | None = None  # the server's CPU time / wall time during the cell
    queue_depth: float | None = None  # mean of serve_queue_depth (all models) sampled during the cell
    other_cores: float | None = None  # CPU used by everything but the server and this client: noise

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float | None:
            return round(float(np.percentile(values, q)) * 1000, 1) if values else None

        return {
            "endpoint": self.endpoint,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "requests_per_s": round(self.requests / self.seconds, 2),
            "tokens_per_s": round(self.tokens / self.seconds, 1) if self.tokens else None,
            "p50_ms": pct(self.latencies, 50),
            "p99_ms": pct(self.latencies, 99),
            "ttft_p50_ms": pct(self.ttfts, 50),
            "ttft_p99_ms": pct(self.ttfts, 99),
            "server_cores": self.server_cores,
            "queue_depth": self.queue_depth,
            "other_cores": self.other_cores,
        }


# --- a lean HTTP/1.1 client: the load generator shares the CPUs with the server, so it must be cheap -----


class Connection:
    """One keep-alive connection; parses Content-Length and chunked responses, counting SSE events."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.event_times: list[float] | None = None  # a list: each token event's arrival time is appended
        # a list: the arrival time of each chunk that holds token events (a server may send several tokens
        # in one chunk; the gap between chunks is what a reader of the stream waits, as vLLM's benchmark counts)
        self.chunk_times: list[float] | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, int, float | None]:
        """Returns (status, body, SSE token events, seconds to the first token event)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        started = time.perf_counter()
        self.writer.write(head.encode() + payload)
        status_line, *header_lines = (await self.reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines if line)}
        status = int(status_line.split()[1])
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"])), 0, None
        data, events, first = b"", 0, None
        while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
            chunk = (await self.reader.readexactly(size + 2))[:-2]
            data += chunk
            count = chunk.count(b"event: token")
            if count and first is None:
                first = time.perf_counter() - started
            if count and self.event_times is not None:
                self.event_times += [time.perf_counter()] * count
            if count and self.chunk_times is not None:
                self.chunk_times.append(time.perf_counter())
            events += count
        await self.reader.readexactly(2)
        return status, data, events, first

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# One request each, returning (generated tokens, time to first token or None).
Client = Callable[[Connection], Awaitable[tuple[int, float | None]]]


def _ok(status: int, data: bytes) -> Any:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
    return json.loads(data) if data[:1] == b"{" else None


async def classify(conn: Connection) -> tuple[int, float | None]:
    status, data, _, _ = await conn.post("/v1/classify", {"text": TEXT})
    _ok(status, data)
    return 0, None


def classify_with(model: str) -> Client:
    """/v1/classify on one named model (several classifiers served side by side)."""

    async def call(conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post("/v1/classify", {"text": TEXT, "model": model})
        _ok(status, data)
        return 0, None

    return call


def translate(num_beams: int, max_new_tokens: int) -> Client:
    async def call(conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post(
            "/v1/translate", {"text": TEXT, "num_beams": num_beams, "max_new_tokens": max_new_tokens}
        )
        return sum(t["output_tokens"] for t in _ok(status, data)["translations"]), None

    return call


def generate(max_new_tokens: int) -> Client:
    async def call(conn: Connection) -> tuple[int, float | None]:
        body = {"prompt": PROMPT, "max_new_tokens": max_new_tokens, "ignore_eos": True, "stream": True, "seed": 0}
        status, data, events, first = await conn.post("/v1/generate", body)
        _ok(status, data)
        if b"event: error" in data:
            raise RuntimeError("error event")
        return events, first

    return call


def completions(max_tokens: int) -> Client:
    async def call(conn: Connection) -> tuple[int, float | None]:
        body = {"model": "generator", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
        status, data, _, _ = await conn.post("/v1/completions", body)
        return _ok(status, data)["usage"]["completion_tokens"], None

    return call


async def drive(base_url: str, name: str, call: Client, concurrency: int, requests: int) -> Cell:
    """`concurrency` workers, one connection each, send `requests` requests in total back to back."""
    cell = Cell(name, concurrency, requests, 0.0)
    remaining = requests
    host, port = base_url.removeprefix("http://").split(":")
    connections = [Connection(host, int(port)) for _ in range(concurrency)]
    await asyncio.gather(*(call(c) for c in connections))  # untimed: connections, caches

    async def worker(conn: Connection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            try:
                tokens, ttft = await call(conn)
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                cell.errors += 1
                conn.close()
                conn.writer = None
                continue
            cell.latencies.append(time.perf_counter() - started)
            cell.tokens += tokens
            if ttft is not None:
                cell.ttfts.append(ttft)

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    cell.seconds = time.perf_counter() - started
    for conn in connections:
        conn.close()
    return cell


async def sample_queue_depth(base_url: str, samples: list[float], period_s: float = 0.1) -> None:
    """Append the server's total serve_queue_depth every `period_s` until cancelled: the signal the
    Kubernetes autoscaler scales on (deploy/kubernetes/components/keda-queue-depth)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as client:
        while True:
            lines = (await client.get("/metrics")).text.splitlines()
            samples.append(sum(float(x.rpartition(" ")[2]) for x in lines if x.startswith("serve_queue_depth{")))
            await asyncio.sleep(period_s)


async def drive_sampled(base_url: str, name: str, call: Client, concurrency: int, requests: int) -> Cell:
    """`drive`, with the queue depth sampled alongside."""
    samples: list[float] = []
    sampler = asyncio.create_task(sample_queue_depth(base_url, samples))
    try:
        cell = await drive(base_url, name, call, concurrency, requests)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    cell.queue_depth = round(statistics.fmean(samples), 2) if samples else None
    return cell


def machine_cpu_seconds() -> float:
    """CPU time all processes have used (the busy fields of /proc/stat's `cpu` line)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used so far."""
    return _cpu_seconds(Path(f"/proc/{pid}/stat"))


@dataclass(frozen=True)
class ThreadCpu:
    process: int  # 0: the server's own process (the engine); 1, 2, ...: its children (front ends)
    main: bool  # the process's main thread: for `python -m service` (and the floor), the one running the event loop
    seconds: float  # CPU time (user + system) so far


def threads_cpu(pid: int) -> dict[int, ThreadCpu]:
    """Every thread of process `pid` and of its children (the front ends of SERVE_API_PROCESSES > 1), by
    thread id. Sums over one snapshot stay consistent (the event loops' share never exceeds the whole),
    which separate reads of /proc/<pid>/stat and of the threads do not: each is rounded to clock ticks."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    out: dict[int, ThreadCpu] = {}
    for index, process in enumerate([pid, *(int(child) for child in children)]):
        for thread in os.listdir(f"/proc/{process}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
                seconds = _cpu_seconds(Path(f"/proc/{process}/task/{thread}/stat"))
                out[int(thread)] = ThreadCpu(index, int(thread) == process, seconds)
    return out


def cpu_between(before: dict[int, ThreadCpu], after: dict[int, ThreadCpu]) -> dict[int, ThreadCpu]:
    """Each thread's CPU time between two snapshots (threads that ended in between are left out)."""
    return {tid: ThreadCpu(t.process, t.main, t.seconds - (before[tid].seconds if tid in before else 0.0))
            for tid, t in after.items()}


def _cpu_seconds(stat: Path) -> float:
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    usage = os.times()
    return usage.user + usage.system


# --- the server --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_record(module: str, options: tuple[tuple[str, object], ...], out: Path, **fields: Any) -> None:
    """A benchmark's JSON: the command that made it (`python -m benchmarks.<module>` with its options), the
    machine, and `fields`."""
    command = f"python -m benchmarks.{module} " + " ".join(f"--{k} {v}" for k, v in options)
    record = {"command": command, "machine": platform.processor() or platform.machine(), **fields}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {out}")


def batch_rows(url: str, model: str, phase: str) -> tuple[float, float]:
    """A model's runs so far in one phase ("prefill" or "decode"), from /metrics: (rows over all of them, how
    many runs)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    pattern = r'^serve_batch_size_{part}{{model="{model}",phase="{phase}"}} (\S+)$'
    found = [re.search(pattern.format(part=part, model=model, phase=phase), text, re.MULTILINE)
             for part in ("sum", "count")]
    rows, runs = (float(match.group(1)) if match else 0.0 for match in found)
    return rows, runs


class Server:
    """`python -m service` in a subprocess, with settings from the environment."""

    def __init__(self, artifacts: Path, threads: int, **settings: Any) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
        env |= {
            "SERVE_HOST": "127.0.0.1",
            "SERVE_PORT": str(self.port),
            "SERVE_ARTIFACTS_DIR": str(artifacts),
            "SERVE_INTRA_OP_THREADS": str(threads),
            "SERVE_LOG_LEVEL": "warning",
            "SERVE_MAX_QUEUE_SIZE": "1024",
            "SERVE_MAX_NEW_TOKENS": "256",
        }
        env |= {f"SERVE_{k.upper()}": str(v) for k, v in settings.items()}
        self.proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, cwd=REPO)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300) -> None:
        wait_until_ready(self.proc, self.url, timeout, poll_s=0.2)

    def __enter__(self) -> Server:
        self.wait_ready()
        return self

    def rss_mb(self) -> float:
        """The server's resident memory now (VmRSS, Linux)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return round(int(match.group(1)) / 1024, 1)

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory so far (VmHWM, Linux): what a container's memory limit must hold."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return round(int(match.group(1)) / 1024, 1)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server has used so far: cores busy = its growth / wall time."""
        return process_cpu_seconds(self.proc.pid)

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- KV cache vs recompute (in process, on the generator graph) --------------------------------------


def kv_cache_vs_recompute(artifacts: Path, threads: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    artifact = load_artifact(artifacts / "generator")
    session = GraphSession(
        "generator", artifact.graphs["decoder"], RuntimeOptions(device="cpu", intra_op_threads=threads)
    )
    L, H, Dh = artifact.n_decoder_layers, artifact.n_kv_heads, artifact.d_head
    names = [f"{i}.{p}" for i in range(L) for p in ("key", "value")]
    ids = list(np.random.default_rng(0).integers(10, artifact.vocab_size, prompt_len))

    def feeds(tokens: list[int], start: int, past: list[Any]) -> dict[str, Any]:
        T = start + len(tokens)
        out: dict[str, Any] = {
            "input_ids": np.array([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, T), dtype=np.int64),
            "position_ids": np.arange(start, T, dtype=np.int64)[None],
        }
        return out | dict(zip((f"past_key_values.{n}" for n in names), past, strict=True))

    empty = [np.zeros((1, H, 0, Dh), dtype=np.float32)] * (2 * L)
    present = [f"present.{n}" for n in names]

    def cached() -> list[int]:
        tokens = list(ids)
        out = session.run(feeds(tokens, 0, empty), ["logits", *present])
        for _ in range(new_tokens):
            tokens.append(int(np.argmax(out["logits"][0, -1])))
            past = [out[n] for n in present]
            out = session.run(feeds(tokens[-1:], len(tokens) - 1, past), ["logits", *present])
        return tokens

    def recompute() -> list[int]:
        tokens = list(ids)
        for _ in range(new_tokens):
            out = session.run(feeds(tokens, 0, empty), ["logits"])
            tokens.append(int(np.argmax(out["logits"][0, -1])))
        return tokens

    timings = {}
    for name, fn in (("kv_cache", cached), ("recompute", recompute)):
        fn()  # warm-up
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            result = fn()
            runs.append(time.perf_counter() - started)
        timings[name] = (statistics.median(runs), result)
    assert timings["kv_cache"][1] == timings["recompute"][1], "cached and recomputed greedy tokens differ"
    cached_s, recompute_s = timings["kv_cache"][0], timings["recompute"][0]
    return {
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "kv_cache_tokens_per_s": round(new_tokens / cached_s, 1),
        "recompute_tokens_per_s": round(new_tokens / recompute_s, 1),
        "speedup": round(recompute_s / cached_s, 2),
    }


# --- the run -----------------------------------------------------------------------------------------


def run_matrix(
    server: Server, clients: dict[str, Client], scale: float, concurrency: tuple[int, ...] = CONCURRENCY
) -> list[Cell]:
    cells = []
    for name, call in clients.items():
        for c in concurrency:
            requests = max(c * 2, round(c * 4 * scale), 8)
            before = (time.perf_counter(), server.cpu_seconds(), machine_cpu_seconds(), client_cpu_seconds())
            cell = asyncio.run(drive_sampled(server.url, name, call, c, requests))
            after = (time.perf_counter(), server.cpu_seconds(), machine_cpu_seconds(), client_cpu_seconds())
            # Over the whole call (its untimed warm-up requests too): CPU time / the same wall time.
            wall_s, server_s, machine_s, client_s = (a - b for a, b in zip(after, before, strict=True))
            cell.server_cores = round(server_s / wall_s, 2)
            cell.other_cores = round(max(0.0, machine_s - server_s - client_s) / wall_s, 2)
            print(f"  {name:<12} c={c:<3} {cell.summary()['requests_per_s']:>8} req/s", flush=True)
            cells.append(cell)
    return cells


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        "endpoint", "concurrency", "requests_per_s", "tokens_per_s", "p50_ms", "p99_ms", "ttft_p50_ms", "server_cores",
        "queue_depth", "other_cores", "errors",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--threads", type=int, default=0, help="SERVE_INTRA_OP_THREADS (0: ORT default)")
    parser.add_argument("--scale", type=float, default=1.0, help="requests per cell, relative")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generated tokens per generation request")
    parser.add_argument(
        "--concurrency",
        type=lambda text: tuple(int(c) for c in text.split(",")),
        default=CONCURRENCY,
        help="comma-separated concurrency levels of the endpoint matrix",
    )
    parser.add_argument("--quantization", choices=("none", "int8"), default="none", help="SERVE_QUANTIZATION")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="SERVE_DEVICE")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results")
    parser.add_argument("--classifiers", default="", help="comma-separated classifiers to measure side by side "
                        "(e.g. classifier,classifier-minilm): a `classify <name>` row each, in the same server")
    args = parser.parse_args()
    if 32 not in args.concurrency:
        parser.error("--concurrency must include 32 (the batching comparison runs at 32)")
    missing = [
        m for m in ("translator", "generator", "classifier") if not (args.artifacts / m / "config.json").is_file()
    ]
    if missing:
        parser.error(
            f"{args.artifacts} lacks {missing}; pass --artifacts "
            "(e.g. from `python -m scripts.export --tiny --out DIR`)"
        )
    n = args.max_new_tokens
    clients: dict[str, Client] = {
        "classify": classify,
        "translate": translate(num_beams=4, max_new_tokens=min(n, 48)),
        "generate": generate(n),
        "completions": completions(n),
    }
    clients |= {f"classify {name}": classify_with(name) for name in filter(None, args.classifiers.split(","))}
    results: dict[str, Any] = {
        "artifacts": str(args.artifacts),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "threads": args.threads,
        "max_new_tokens": n,
        "quantization": args.quantization,
        "device": args.device,
    }

    print("batching on (SERVE_MAX_BATCH_SIZE=32)", flush=True)
    settings = {"quantization": args.quantization, "device": args.device}
    with Server(args.artifacts, args.threads, max_batch_size=32, **settings) as server:
        cells = run_matrix(server, clients, args.scale, args.concurrency)
        streams_on = asyncio.run(drive(server.url, "generate", generate(n), 16, max(32, int(48 * args.scale))))
        results["server_peak_rss_mb"] = server.peak_rss_mb()
    print("batching off (SERVE_MAX_BATCH_SIZE=1)", flush=True)
    with Server(args.artifacts, args.threads, max_batch_size=1, **settings) as server:
        classify_off = asyncio.run(drive(server.url, "classify", classify, 32, max(64, int(128 * args.scale))))
        streams_off = asyncio.run(drive(server.url, "generate", generate(n), 16, max(32, int(48 * args.scale))))
    classify_on = next(c for c in cells if c.endpoint == "classify" and c.concurrency == 32)

    rows = [c.summary() for c in cells]
    results["endpoints"] = rows
    results["dynamic_batching"] = {
        "classify_c32_on_requests_per_s": classify_on.summary()["requests_per_s"],
        "classify_c32_off_requests_per_s": classify_off.summary()["requests_per_s"],
        "speedup": round(
            classify_on.requests / classify_on.seconds / (classify_off.requests / classify_off.seconds), 2
        ),
    }
    results["continuous_batching"] = {
        "streams": 16,
        "on_tokens_per_s": streams_on.summary()["tokens_per_s"],
        "one_at_a_time_tokens_per_s": streams_off.summary()["tokens_per_s"],
        "on_ttft_p50_ms": streams_on.summary()["ttft_p50_ms"],
        "one_at_a_time_ttft_p50_ms": streams_off.summary()["ttft_p50_ms"],
        "speedup": round((streams_on.tokens / streams_on.seconds) / (streams_off.tokens / streams_off.seconds), 2),
    }
    print("KV cache vs recompute", flush=True)
    context = load_artifact(args.artifacts / "generator").max_positions
    results["kv_cache"] = [
        kv_cache_vs_recompute(args.artifacts, args.threads, prompt_len=p, new_tokens=n)
        for p in (16, 128)
        if p + n < context
    ]

    print()
    print(table(rows))
    db, cb = results["dynamic_batching"], results["continuous_batching"]
    print()
    print("| comparison | on | off | speedup |\n|---|---|---|---|")
    print(
        f"| dynamic batching, classify req/s at c=32 | {db['classify_c32_on_requests_per_s']} | "
        f"{db['classify_c32_off_requests_per_s']} | {db['speedup']}x |"
    )
    print(
        f"| continuous batching, tokens/s at 16 streams | {cb['on_tokens_per_s']} | "
        f"{cb['one_at_a_time_tokens_per_s']} | {cb['speedup']}x |"
    )
    for kv in results["kv_cache"]:
        print(
            f"| KV cache vs recompute, tokens/s (prompt {kv['prompt_tokens']}, {kv['new_tokens']} new) | "
            f"{kv['kv_cache_tokens_per_s']} | {kv['recompute_tokens_per_s']} | {kv['speedup']}x |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nserver peak RSS (VmHWM) after the matrix: {results['server_peak_rss_mb']} MB")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
