"""Where a server's CPU goes, per process and thread: our service on tiny random artifacts, one cell of one
client, and the CPU time each thread of the server's processes used over it, per request or per token.

    python -m benchmarks.process_threads [--client classify|generate] [--concurrency 32] [--requests 4000]
                                         [--api-processes 2] [--threads 2]

With SERVE_API_PROCESSES > 1 the engine process's threads and each front end's are told apart: the engine's
main thread runs its event loop (the relay to the front ends), its other threads are the models' workers
and ONNX Runtime's; a front end's main thread runs its event loop (HTTP, validation, tokenizing, rendering).
Prints one line per thread kind, in microseconds per unit, and the generator's decode steps over the cell
with their mean rows (from /metrics); nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from benchmarks.cpu_time import ThreadCpu, cpu_between, threads_cpu
from benchmarks.http_load import classify, drive, generate
from benchmarks.server_process import Server, batch_rows
from model.export.tiny import export_tiny_artifacts

STREAM_TOKENS = 64


def kind_of(thread: ThreadCpu) -> str:
    role = "engine" if thread.process == 0 else f"front end {thread.process}"
    return f"{role}: {'event loop' if thread.main else 'workers and ONNX Runtime'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", choices=("classify", "generate"), default="classify")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--api-processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="the server's intra-op threads")
    args = parser.parse_args()
    client = classify if args.client == "classify" else generate(STREAM_TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp)
        export_tiny_artifacts(artifacts, ("classifier", "generator"))
        settings = {"models": "classifier,generator", "api_processes": args.api_processes}
        with Server(artifacts, args.threads, **settings) as server:
            asyncio.run(drive(server.url, "warm-up", client, args.concurrency, 300))
            before, rows_before = threads_cpu(server.proc.pid), batch_rows(server.url, "generator", "decode")
            cell = asyncio.run(drive(server.url, "cell", client, args.concurrency, args.requests))
            after, rows_after = threads_cpu(server.proc.pid), batch_rows(server.url, "generator", "decode")
    units = cell.tokens if args.client == "generate" else args.requests
    per_kind: dict[str, float] = {}
    for thread in cpu_between(before, after).values():
        per_kind[kind_of(thread)] = per_kind.get(kind_of(thread), 0.0) + thread.seconds
    unit = "token" if args.client == "generate" else "request"
    rate = units / cell.seconds
    print(f"{args.client}, {args.concurrency} concurrent, SERVE_API_PROCESSES={args.api_processes}: "
          f"{rate:.0f} {unit}s/s, {1e6 * sum(per_kind.values()) / units:.0f} us of CPU per {unit}")
    for kind, seconds in sorted(per_kind.items(), key=lambda item: -item[1]):
        print(f"  {kind}: {1e6 * seconds / units:.0f} us/{unit}")
    steps = rows_after[1] - rows_before[1]
    if steps:
        print(f"  decode steps: {steps:.0f}, {(rows_after[0] - rows_before[0]) / steps:.1f} rows each on average")



if __name__ == "__main__":
    main()
