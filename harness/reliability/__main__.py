"""Run the reliability suite and write its figures.

    python -m harness.reliability                      # every section against servers started here (the
                                                     # committed artifacts and the suite's chat model and
                                                     # reranker, built on first use: the train extra),
                                                     # JSON to bench_results/reliability.json
    python -m harness.reliability --doc                # also rewrite the table in docs/testing.md
    python -m harness.reliability --url http://127.0.0.1:8000 --container CID \\
        --sections load,sigterm --setting SERVE_DRAIN_TIMEOUT_S=5   # a running container (deploy test)

Exit status 1 if any section failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness.reliability import sections
from harness.reliability.harness import ARTIFACTS, OVERLOAD_SETTINGS, REPO, SUITE_SETTINGS, LocalServer, Target
from harness.reliability.memory import MEMORY_SETTINGS
from harness.reliability.report import DOC, DOC_BEGIN, DOC_END, table
from harness.reliability.suite_models import link_models, suite_models
from harness.reliability.transport import SEND_TIMEOUT_SETTINGS, TRANSPORT_SETTINGS

ON_SERVER = ("schemathesis", "bad_input", "load", "attention", "tokenize", "list_bombs", "disconnects", "soak")
ALL = (*ON_SERVER, "memory", "kv_budget", "chat_templates", "overload", "sigterm", "artifacts", "faults",
       "slow_clients", "stuck_drain", "stuck_readers")  # fmt: skip
# These end the server they run against: they run last.
CONSUMING = ("sigterm", "stuck_drain")


async def run_local(names: list[str], soak_s: float, examples: int) -> list[sections.Outcome]:
    outcomes = []
    shared = [n for n in ON_SERVER if n in names]
    with tempfile.TemporaryDirectory() as folder:
        needs_models = shared or "memory" in names or "kv_budget" in names
        served = link_models(Path(folder) / "served", suite_models()) if needs_models else ARTIFACTS
        if shared:
            with LocalServer(served) as server:
                target = server.wait_ready()
                for name in shared:
                    outcomes.append(await _run(name, target, soak_s, examples))
        if "memory" in names:
            with LocalServer(served, base=SUITE_SETTINGS | MEMORY_SETTINGS) as server:
                outcomes.append(await sections.memory(server.wait_ready()))
        if "kv_budget" in names:
            outcomes.append(await sections.kv_budget(served))
    if "chat_templates" in names:
        outcomes.append(await sections.chat_templates(suite_models()))
    outcomes += await _own_servers(names)
    return outcomes


async def _own_servers(names: list[str]) -> list[sections.Outcome]:
    """The sections that start servers of their own, on the committed artifacts."""
    outcomes = []
    if "overload" in names:
        with LocalServer(base=SUITE_SETTINGS | OVERLOAD_SETTINGS) as server:
            outcomes.append(await sections.overload(server.wait_ready()))
    if "sigterm" in names:
        with LocalServer(SERVE_MAX_BATCH_SIZE="16", SERVE_DRAIN_TIMEOUT_S="2") as server:
            outcomes.append(await sections.sigterm(server.wait_ready()))
    if "artifacts" in names:
        outcomes.append(await sections.artifacts())
    if "faults" in names:
        outcomes.append(await sections.faults())
    transport = [n for n in ("slow_clients", "stuck_drain") if n in names]
    if transport:
        with LocalServer(base=SUITE_SETTINGS | TRANSPORT_SETTINGS) as server:
            target = server.wait_ready()
            for name in transport:
                outcomes.append(await getattr(sections, name)(target))
    if "stuck_readers" in names:
        with LocalServer(base=SUITE_SETTINGS | SEND_TIMEOUT_SETTINGS) as server:
            outcomes.append(await sections.stuck_readers(server.wait_ready()))
    return outcomes


async def _run(name: str, target: Target, soak_s: float, examples: int) -> sections.Outcome:
    print(f"-- {name}", flush=True)
    if name == "schemathesis":
        return await sections.schemathesis(target, max_examples=examples)
    if name == "soak":
        return await sections.soak(target, seconds=soak_s)
    if name == "sigterm":
        return await sections.sigterm(target)
    if name == "chat_templates":  # servers of its own, whatever the target
        return await sections.chat_templates(suite_models())
    section: Callable[[Target], Awaitable[sections.Outcome]] = getattr(sections, name)
    return await section(target)


def container_target(url: str, container: str, settings: dict[str, str]) -> Target:
    docker = os.environ.get("DOCKER", "docker")

    def wait_exit(timeout: float) -> int:
        done = subprocess.run([docker, "wait", container], capture_output=True, text=True, timeout=timeout)
        return int(done.stdout.strip() or -1)

    def terminate() -> None:
        subprocess.run([docker, "kill", "--signal", "TERM", container], check=True, capture_output=True)

    return Target(url, settings, terminate=terminate, wait_exit=wait_exit)


def write_report(outcomes: list[sections.Outcome], path: Path, mode: str, settings: dict[str, str]) -> dict[str, Any]:
    report = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": mode,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": settings,
        "passed": all(o.passed for o in outcomes),
        "seconds": round(sum(o.seconds for o in outcomes), 1),
        "sections": {
            o.name: {"passed": o.passed, "seconds": o.seconds, "figures": o.figures, "failures": o.failures}
            for o in outcomes
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def update_doc(report: dict[str, Any]) -> None:
    doc = REPO / DOC
    text = doc.read_text()
    block = f"{DOC_BEGIN}\n{table(report)}\n{DOC_END}"
    pattern = re.compile(re.escape(DOC_BEGIN) + ".*?" + re.escape(DOC_END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{DOC} has no {DOC_BEGIN} ... {DOC_END} block")
    doc.write_text(pattern.sub(lambda _: block, text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(ALL), help=f"comma-separated, from {','.join(ALL)}")
    parser.add_argument("--url", help="a running server (then --container for SIGTERM)")
    parser.add_argument("--container", help="the container behind --url (docker kill / docker wait)")
    parser.add_argument("--setting", action="append", default=[], help="NAME=VALUE the running server uses")
    parser.add_argument("--report", type=Path, default=REPO / "bench_results" / "reliability.json")
    parser.add_argument("--doc", action="store_true", help=f"rewrite the table in {DOC}")
    parser.add_argument("--soak-s", type=float, default=float(os.environ.get("RELIABILITY_SOAK_S", "30")))
    parser.add_argument("--examples", type=int, default=10, help="schemathesis examples per operation")
    args = parser.parse_args()
    names = [n.strip() for n in args.sections.split(",") if n.strip()]
    unknown = set(names) - set(ALL)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    if args.url:
        settings = dict(item.split("=", 1) for item in args.setting)
        target = container_target(args.url, args.container, settings) if args.container else Target(args.url, settings)
        outcomes = asyncio.run(_run_on(names, target, args.soak_s, args.examples))
        mode = "running server"
    else:
        settings = SUITE_SETTINGS
        outcomes = asyncio.run(run_local(names, args.soak_s, args.examples))
        mode = "local servers"
    report = write_report(outcomes, args.report, mode, settings)
    print(table(report))
    print(f"report: {args.report}")
    for outcome in outcomes:
        for failure in outcome.failures:
            print(f"FAILED {outcome.name}: {failure}", file=sys.stderr)
    if args.doc:
        update_doc(report)
    raise SystemExit(0 if report["passed"] else 1)


async def _run_on(names: list[str], target: Target, soak_s: float, examples: int) -> list[sections.Outcome]:
    ordered = [n for n in names if n not in CONSUMING] + [n for n in CONSUMING if n in names]
    return [await _run(name, target, soak_s, examples) for name in ordered]


if __name__ == "__main__":
    main()
