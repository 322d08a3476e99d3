"""The compose `scale` profile for real: `api` + 2 replicas behind nginx, one replica stopped mid-load.
Called by harness/deploy/run.sh once the server and load-balancer images are built. Standard library only.

    python harness/deploy/scale.py [--project tsdeploy]

1. Renders docker-compose.yml + harness/deploy/docker-compose.ci.yml with `--profile scale` for host
   networking (harness/deploy/compose.py) and gives each replica its own port: `api` DEPLOY_API_PORT (8000),
   `replica` and a second copy of it, `replica-2`, the two of DEPLOY_REPLICA_PORTS (8001, 8002; Compose
   would start both copies on one port). nginx, on DEPLOY_LB_PORT (8080), gets deploy/nginx.conf with its
   `replica` upstream line turned into those two ports; nothing else changes.
2. Starts the three servers and nginx, and sends REQUESTS mixed requests (classify, translate greedy and
   beam, generate and completions, streamed and not) through nginx from WORKERS threads.
3. After a third of them, SIGTERM to `replica-2` (as `docker stop` does): it drains and exits.
4. Checks: every request answered 200 with a well-formed answer; every replica served a share (counted
   from each replica's own /metrics, and the same counts from nginx's log of upstreams); the only
   refused attempts are the stopped replica's drain 503s (or its closed connections), each retried
   by nginx on another replica; the stopped replica exited 0.
5. `docker-compose down` of the project (also on failure, after the logs).
Prints one line per check and a closing `N passed, N failed`; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy reads the repository as packages; the script imports its siblings from its own folder
    from harness.deploy.compose import command, ports, rendered, write
    from harness.deploy.e2e_checks import Checks, ok
    from harness.deploy.e2e_client import Client, collect_completion_stream, collect_generate_stream, docker_kill
else:
    from compose import command, ports, rendered, write
    from e2e_checks import Checks, ok
    from e2e_client import Client, collect_completion_stream, collect_generate_stream, docker_kill

ROOT = Path(__file__).resolve().parents[2]
DOCKER = os.environ.get("DOCKER", "docker")
PORTS = ports()
if len(PORTS.replicas) != 2:
    raise SystemExit(f"DEPLOY_REPLICA_PORTS names {len(PORTS.replicas)} ports; the scale run starts 2 replicas")
REPLICAS = {"api": PORTS.api, "replica": PORTS.replicas[0], "replica-2": PORTS.replicas[1]}
STOPPED = "replica-2"
LB_PORT = PORTS.lb
REQUESTS = 300
WORKERS = 8
STOP_AFTER = REQUESTS // 3
INFERENCE = ("/v1/classify", "/v1/translate", "/v1/generate", "/v1/completions")


# --- the deployment ------------------------------------------------------------------------------------


class Deployment:
    def __init__(self, project: str) -> None:
        self.project = project
        self.compose_file: Path | None = None

    def compose(self, *args: str, capture: bool = False) -> str:
        assert self.compose_file is not None, "write() first"
        result = subprocess.run(
            command(self.project, self.compose_file, ["scale"], list(args)), cwd=ROOT, capture_output=capture, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {result.returncode} {result.stderr or ''}")
        return result.stdout or ""

    def write(self) -> None:
        """The real `scale` profile (+ the CI override) on the host network, one port per replica."""
        doc = rendered(["scale"])
        for name in ("api", "replica", "lb"):
            assert name in doc["services"], f"the scale profile has no `{name}` service"
        self.compose_file = write(self.project, doc, REPLICAS, LB_PORT)

    def container(self, service: str) -> str:
        cid = self.compose("ps", "-q", service, capture=True).strip()
        assert cid, f"no container for {service}"
        return cid

    def state(self, service: str) -> tuple[str, int]:
        out = subprocess.run(
            [DOCKER, "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", self.container(service)],
            check=True, capture_output=True, text=True,
        ).stdout.split()
        return out[0], int(out[1])

    def wait_ready(self, service: str, url: str, limit_s: float = 300) -> float:
        client, started = Client(url, timeout=5), time.monotonic()
        while True:
            try:
                if client.get("/ready").status == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            status, code = self.state(service)
            assert status == "running", f"{service} is {status} (exit {code}) while waiting for {url}/ready"
            assert time.monotonic() - started < limit_s, f"{url}/ready not 200 after {limit_s:.0f}s"
            time.sleep(1)


# --- metrics -------------------------------------------------------------------------------------------


def served(metrics_text: str) -> Counter[str]:
    """Inference requests a server counted, by status (serve_requests_total)."""
    counts: Counter[str] = Counter()
    pattern = r'^serve_requests_total\{endpoint="([^"]+)",status="(\d+)"\} (\S+)$'
    for endpoint, status, value in re.findall(pattern, metrics_text, re.MULTILINE):
        if endpoint in INFERENCE:
            counts[status] += int(float(value))
    return counts


def scrape(port: int) -> Counter[str]:
    return served(Client(f"http://127.0.0.1:{port}", timeout=5).get("/metrics").text)


def upstream_log(lines: list[str]) -> list[tuple[str, list[tuple[int, str]]]]:
    """(request line, [(upstream port, status) per attempt]) for each inference request nginx logged."""
    entries = []
    for line in lines:
        match = re.search(r'"POST (\S+) HTTP/[\d.]+" (\d+) .* upstream=(.+) upstream_status=(.+)$', line)
        if not match or match.group(1) not in INFERENCE:
            continue
        # One upstream group here: attempts are separated by ", ".
        ports = [int(address.rpartition(":")[2]) for address in match.group(3).split(", ")]
        statuses = match.group(4).split(", ")
        assert len(ports) == len(statuses), line
        entries.append((f"{match.group(1)} {match.group(2)}", list(zip(ports, statuses, strict=True))))
    return entries


# --- the load ------------------------------------------------------------------------------------------


def request_mix() -> list[tuple[str, Callable[[Client], str]]]:
    """(name, call) pairs; each call checks its answer and returns a short note."""

    def classify(client: Client) -> str:
        reply = client.post("/v1/classify", {"text": ["A moving, brilliant film.", ["Thin plot.", "Good cast."]]})
        results = ok(reply, "classify")["results"]
        assert len(results) == 2 and all(r["label"] for r in results), results
        label: str = results[0]["label"]
        return label

    def translate(beams: int) -> Callable[[Client], str]:
        def call(client: Client) -> str:
            body = {"text": "And God said, Let there be light.", "num_beams": beams, "max_new_tokens": 24}
            (translation,) = ok(client.post("/v1/translate", body), "translate")["translations"]
            assert translation["text"] and translation["output_tokens"] > 0, translation
            text: str = translation["text"]
            return text

        return call

    def generate(client: Client) -> str:
        body = {"prompt": "The people of the city", "max_new_tokens": 16, "ignore_eos": True, "seed": 3}
        answer = ok(client.post("/v1/generate", body), "generate")
        assert answer["usage"]["completion_tokens"] == 16, answer
        text: str = answer["text"]
        return text

    def generate_stream(client: Client) -> str:
        body = {"prompt": "In the morning", "max_new_tokens": 24, "ignore_eos": True, "seed": 5}
        tokens, done = collect_generate_stream(client, body)
        assert len(tokens) == done["usage"]["completion_tokens"] == 24, (len(tokens), done)
        text: str = done["text"]
        return text

    def completions(client: Client) -> str:
        body = {"model": "generator", "prompt": "Fellow citizens", "max_tokens": 16, "ignore_eos": True}
        answer = ok(client.post("/v1/completions", body), "completions")
        assert answer["usage"]["completion_tokens"] == 16, answer
        text: str = answer["choices"][0]["text"]
        return text

    def completions_stream(client: Client) -> str:
        body = {"model": "generator", "prompt": "Once there was", "max_tokens": 16, "ignore_eos": True}
        text, finish = collect_completion_stream(client, body)
        assert finish == "length", finish
        return text

    return [
        ("classify", classify),
        ("translate greedy", translate(1)),
        ("translate beam 2", translate(2)),
        ("generate", generate),
        ("generate stream", generate_stream),
        ("completions", completions),
        ("completions stream", completions_stream),
    ]


class Load:
    """REQUESTS requests through the load balancer; `on_progress(n)` after each completed one."""

    def __init__(self, url: str, on_progress: Callable[[int], None]) -> None:
        self.client = Client(url, timeout=120)
        self.on_progress = on_progress
        self.failures: list[str] = []
        self.by_kind: Counter[str] = Counter()
        self.done = 0
        self.lock = threading.Lock()

    def one(self, index: int) -> None:
        mix = request_mix()
        name, call = mix[index % len(mix)]
        try:
            call(self.client)
        except (AssertionError, OSError, urllib.error.URLError, ValueError) as exc:
            with self.lock:
                self.failures.append(f"#{index} {name}: {exc!r}"[:300])
        with self.lock:
            self.by_kind[name] += 1
            self.done += 1
            done = self.done
        self.on_progress(done)

    def run(self) -> float:
        started = time.monotonic()
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(self.one, range(REQUESTS)))
        return time.monotonic() - started


# --- the test ------------------------------------------------------------------------------------------


class ScaleRun:
    """The run's steps, each a check (a short note, or an AssertionError); what one finds, the next reads."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.before: dict[str, Counter[str]] = {}  # each replica's counts before the load
        self.since = 0  # when the load started (nginx's log from here)
        self.load_run: Load | None = None
        self.delta: dict[str, int] = {}  # the 200s each replica served during the load
        self.stopper: dict[str, Any] = {}  # the stop of the replica: when, its counts, its exit
        self.stop_thread = threading.Thread(target=self.stop_replica, daemon=True)

    def start(self) -> str:
        self.deployment.write()
        self.deployment.compose("up", "-d", "--no-build", *REPLICAS)
        waits = {name: self.deployment.wait_ready(name, f"http://127.0.0.1:{port}") for name, port in REPLICAS.items()}
        self.deployment.compose("up", "-d", "--no-build", "--no-deps", "lb")
        self.wait_lb()
        self.before = {name: scrape(port) for name, port in REPLICAS.items()}
        return ", ".join(f"{name} :{port} ready after {waits[name]:.0f}s" for name, port in REPLICAS.items())

    def wait_lb(self) -> None:
        client, started = Client(f"http://127.0.0.1:{LB_PORT}", timeout=5), time.monotonic()
        while True:
            try:
                if client.get("/lb-health").status == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() - started < 30, "nginx /lb-health not 200 after 30s"
            time.sleep(0.5)

    def stop_replica(self) -> None:
        """SIGTERM, then follow the stopped replica's own /metrics for as long as it answers."""
        stopper = self.stopper
        cid = self.deployment.container(STOPPED)
        stopper["at"] = time.monotonic()
        stopper["before_stop"] = scrape(REPLICAS[STOPPED])
        docker_kill(cid, "SIGTERM")
        last = stopper["before_stop"]
        while True:
            try:
                last = scrape(REPLICAS[STOPPED])
            except OSError:
                break
            time.sleep(0.1)
        stopper["last"] = last
        code = subprocess.run([DOCKER, "wait", cid], capture_output=True, text=True, timeout=120).stdout.strip()
        stopper["exit"] = (int(code), time.monotonic() - stopper["at"])

    def on_progress(self, done: int) -> None:
        if done == STOP_AFTER:
            self.stop_thread.start()

    def load(self) -> str:
        run = Load(f"http://127.0.0.1:{LB_PORT}", self.on_progress)
        self.since = int(time.time())  # nginx's log from here: the load balancer may have served before
        took = run.run()
        self.stop_thread.join(timeout=120)
        self.load_run = run
        assert not run.failures, f"{len(run.failures)} failed: " + "; ".join(run.failures[:5])
        assert run.done == REQUESTS, run.done
        mix = ", ".join(f"{n} {c}" for n, c in sorted(run.by_kind.items()))
        return f"{REQUESTS} requests, all 200 and well-formed, in {took:.1f}s ({mix})"

    def stopped_cleanly(self) -> str:
        assert "exit" in self.stopper, "the stop of the replica did not finish"
        code, took = self.stopper["exit"]
        assert code == 0, f"{STOPPED} exited with {code} after SIGTERM (expected 0: a clean drain)"
        return f"{STOPPED} got SIGTERM after {STOP_AFTER} requests, drained and exited 0 in {took:.1f}s"

    def spread(self) -> str:
        after = {name: scrape(port) for name, port in REPLICAS.items() if name != STOPPED}
        after[STOPPED] = self.stopper["last"]
        delta = {name: after[name]["200"] - self.before[name]["200"] for name in REPLICAS}
        self.delta = delta
        for name, count in delta.items():
            assert count >= REQUESTS // 20, f"{name} served only {count} of {REQUESTS}: not spread ({delta})"
        # What nginx answered 200 was served by one of the replicas: the live ones exactly, the stopped
        # one at least up to its last scrape (it may finish a request or two after it).
        assert sum(delta.values()) <= REQUESTS, delta
        counts = ", ".join(f"{name} {count}" for name, count in delta.items())
        return f"{counts} (200s counted by each replica's /metrics)"

    def nginx_agrees(self) -> str:
        logs = subprocess.run(
            [DOCKER, "logs", "--since", str(self.since), self.deployment.container("lb")],
            capture_output=True, text=True, check=True,
        )
        entries = upstream_log((logs.stdout + logs.stderr).splitlines())
        assert len(entries) == REQUESTS, f"nginx logged {len(entries)} inference requests, sent {REQUESTS}"
        final, refused, retried = attempts_by_port(entries)
        delta = self.delta
        for name, port in REPLICAS.items():
            if name == STOPPED:
                assert delta[name] <= final[port] <= delta[name] + WORKERS, (name, delta[name], final[port])
            else:
                assert final[port] == delta[name], f"{name}: nginx says {final[port]}, its /metrics {delta[name]}"
        drain_503 = self.stopper["last"]["503"] - self.before[STOPPED]["503"]
        assert drain_503 <= refused[(REPLICAS[STOPPED], "503")], (drain_503, refused)
        return (
            f"nginx: {retried} request(s) retried on another replica after {dict(refused) or 'no'} refusal(s) "
            f"by {STOPPED} ({drain_503} drain 503s in its /metrics); every other attempt 200"
        )

    def checks(self) -> int:
        """Each step once the steps it reads from have succeeded; 1 if any failed."""
        checks = Checks()
        checks.run("scale profile up: 3 servers + nginx", self.start)
        if self.before:
            checks.run(f"{REQUESTS} mixed requests through nginx, {STOPPED} stopped mid-load", self.load)
            checks.run(f"{STOPPED} drains and exits 0", self.stopped_cleanly)
            if self.load_run is not None and "exit" in self.stopper:
                checks.run("requests spread over all replicas", self.spread)
                checks.run("nginx log matches the replicas' metrics", self.nginx_agrees)
        return checks.finish()


def attempts_by_port(
    entries: list[tuple[str, list[tuple[int, str]]]],
) -> tuple[Counter[int], Counter[tuple[int, str]], int]:
    """From nginx's log of upstreams: the final (200) attempts by port, the refused attempts by (port,
    status), and how many requests were retried. Only the stopped replica may refuse: its drain 503, or
    its connection closing at exit."""
    final: Counter[int] = Counter()
    refused: Counter[tuple[int, str]] = Counter()
    retried = 0
    for request, attempts in entries:
        assert request.endswith(" 200"), f"nginx answered {request}"
        *earlier, (port, status) = attempts
        assert status == "200", (request, attempts)
        final[port] += 1
        retried += bool(earlier)
        for port_refused, status_refused in earlier:
            assert port_refused == REPLICAS[STOPPED] and status_refused in ("503", "502"), (request, attempts)
            refused[(port_refused, status_refused)] += 1
    return final, refused, retried


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", default="tsdeploy")
    parser.add_argument("--keep", action="store_true", help="leave the containers running afterwards")
    args = parser.parse_args()
    deployment = Deployment(args.project)
    try:
        rc = ScaleRun(deployment).checks()
        if rc:
            print(deployment.compose("logs", "--no-color", "--tail", "40", capture=True), file=sys.stderr)
    finally:
        if not args.keep:
            deployment.compose("down", "--remove-orphans", "-t", "5")
    return rc


if __name__ == "__main__":
    sys.exit(main())
