"""Measuring the anchor's rows: our server over HTTP (Ours, its clients of each workload; over_http), the
other engines each in a process of its own (Worker, benchmarks/anchor_engines.py), and one round of every
row on every engine (measure_round)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.anchor_engines import PARTS, ROWS, AnchorModel, model_of
from benchmarks.anchor_shapes import SOURCE, TEXT, Shapes
from benchmarks.cpu_time import client_cpu_seconds, machine_cpu_seconds, process_cpu_seconds
from benchmarks.http_floor import FloorServer
from benchmarks.http_load import Cell, Client, Connection, _ok, drive
from benchmarks.server_process import Server

REPO = Path(__file__).resolve().parent.parent


class Ours:
    """HTTP clients for our server (benchmarks/http_load.py's Connection and drive); lengths forced with ignore_eos."""

    def __init__(self, shapes: Shapes) -> None:
        self.s = shapes
        self.gaps: list[list[float]] = []  # per streamed request: its inter-token gaps, seconds
        self.lengths: list[int] = []

    def generate(self, stream: bool, model: str, prompt: list[int]) -> Client:
        body = {"model": model, "prompt": prompt, "max_new_tokens": self.s.new_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream": stream}

        async def call(conn: Connection) -> tuple[int, float | None]:
            conn.event_times = [] if stream else None
            status, data, events, first = await conn.post("/v1/generate", body)
            if stream:
                _ok(status, data)
                if b"event: error" in data:
                    raise RuntimeError("error event")
                assert conn.event_times is not None
                self.gaps.append(list(np.diff(conn.event_times)))
                self.lengths.append(events)
                return events, first
            tokens = int(_ok(status, data)["usage"]["completion_tokens"])
            self.lengths.append(tokens)
            return tokens, None
        return call

    def translate(self, beams: int) -> Client:
        body = {"model": "translator", "text": SOURCE, "num_beams": beams, "max_new_tokens": self.s.target_tokens,
                "no_repeat_ngram_size": 0, "length_penalty": 1.0}

        async def call(conn: Connection) -> tuple[int, float | None]:
            status, data, _, _ = await conn.post("/v1/translate", body)
            tokens = sum(t["output_tokens"] for t in _ok(status, data)["translations"])
            self.lengths.append(tokens)
            return tokens, None
        return call

    async def classify(self, conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post("/v1/classify", {"model": "classifier", "text": TEXT})
        _ok(status, data)
        self.lengths.append(0)
        return 1, None

    async def embed(self, conn: Connection) -> tuple[int, float | None]:
        status, data, _, _ = await conn.post("/v1/embeddings", {"model": "embedder", "input": TEXT})
        _ok(status, data)
        self.lengths.append(0)
        return 1, None


# --- measuring ---------------------------------------------------------------------------------------------


def over_http(url: str, ours: Ours, client: Client, concurrency: int, requests: int) -> tuple[float, list[int]]:
    ours.gaps, ours.lengths = [], []
    cell: Cell = asyncio.run(drive(url, "anchor", client, concurrency, requests))
    if cell.errors:
        raise RuntimeError(f"{cell.errors} of {requests} requests failed")
    skip = concurrency  # drive's untimed warm-up requests come first
    ours.gaps, ours.lengths = ours.gaps[skip:], ours.lengths[skip:]
    return cell.tokens / cell.seconds, ours.lengths


class Worker:
    """An engine in its own process (benchmarks/anchor_engines.py)."""

    def __init__(self, engine: str, part: str, argv: list[str]) -> None:
        self.engine, self.part = engine, part
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.anchor_engines", engine, part, *argv],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if request:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.engine} {self.part} worker exited with {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def measure(self, row: str, concurrency: int, requests: int) -> tuple[float, list[int]]:
        out = self.ask({"row": row, "concurrency": concurrency, "requests": requests})
        value: float = out["value"]
        lengths: list[int] = out["lengths"]
        return value, lengths

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure_round(servers: dict[str, Server], floor: FloorServer, ours: Ours, workers: dict[tuple[str, str], Worker],
                  scale: float, rows: list[str]) -> dict[str, Any]:
    clients = {key: ROWS[key].http(ours, ours.s) for key in rows}

    def ours_cpu() -> float:
        processes: list[Server | Worker] = [*servers.values(), *workers.values()]
        return (client_cpu_seconds() + process_cpu_seconds(floor.proc.pid)
                + sum(x.cpu_seconds() for x in processes))

    out: dict[str, Any] = {}
    for key in rows:
        concurrency = ROWS[key].concurrency
        requests = max(concurrency, round(ROWS[key].requests * scale))
        before = (time.perf_counter(), machine_cpu_seconds(), ours_cpu())
        url = servers[model_of(key).server].url
        row: dict[str, Any] = {"lengths": {}}
        row["ours"], lengths = over_http(url, ours, clients[key], concurrency, requests)
        row["lengths"]["ours"] = sorted(set(lengths))
        if key == "generator_c16_stream":  # the other engines' numbers are those of generator_c16
            gaps = np.concatenate([np.zeros(0), *map(np.asarray, ours.gaps)]) * 1000
            out["inter_token_ms"] = {"p50": float(np.percentile(gaps, 50)), "p99": float(np.percentile(gaps, 99))}
        time.sleep(0.1)
        # The same requests, 10 times as many: the floor answers them 5-100 times faster than a model does.
        row["floor"], _ = over_http(floor.url, ours, clients[key], concurrency, 10 * requests)
        for name in ("engine", "ct2", "hf"):
            if key == "generator_c16_stream":
                row[name], row["lengths"][name] = out["generator_c16"][name], out["generator_c16"]["lengths"][name]
            elif (name, PARTS[key]) in workers:
                time.sleep(0.1)  # let the last engine's spinning threads go idle
                row[name], lengths = workers[name, PARTS[key]].measure(key, concurrency, requests)
                row["lengths"][name] = sorted(set(lengths))
            else:
                row[name] = row["lengths"][name] = None
        row["ours_per_ct2"] = row["ours"] / row["ct2"]
        # An engine as fast as CTranslate2 behind a server that costs what the floor does: on the same cores
        # their times per unit add up (one request at a time, or all cores busy), 1 / (1 / ct2 + 1 / floor).
        row["ceiling_per_ct2"] = row["floor"] / (row["ct2"] + row["floor"])
        row["engine_per_ct2"] = row["engine"] / row["ct2"] if row["engine"] else None
        row["ours_per_hf"] = row["ours"] / row["hf"] if row["hf"] else None
        now = (time.perf_counter(), machine_cpu_seconds(), ours_cpu())
        wall, machine, mine = (a - b for a, b in zip(now, before, strict=True))
        row["other_cores"] = round(max(0.0, machine - mine) / wall, 2)  # CPU that other processes took: noise
        print(f"  {key:<24} ours {row['ours']:>9.1f}  engine {row['engine'] or float('nan'):>9.1f}  "
              f"ct2 {row['ct2'] or float('nan'):>9.1f}  "
              f"hf {row['hf'] or float('nan'):>9.1f}  ours/ct2 {row['ours_per_ct2']:.2f}  "
              f"ceiling {row['ceiling_per_ct2']:.2f}  other cores {row['other_cores']}", flush=True)
        out[key] = row
        time.sleep(0.1)
    return out


def check_tokens(workers: dict[tuple[str, str], Worker], shapes: Shapes, model: AnchorModel[Any]) -> dict[str, Any]:
    """Greedy tokens of ours in process and CTranslate2 on the same prompts (same weights): equal or not."""
    assert model.check is not None
    prompts = shapes.check_prompts
    tokens = {name: workers[name, model.name].ask({"greedy": prompts})["tokens"] for name in ("engine", "ct2")}
    same = [a == b for a, b in zip(tokens["engine"], tokens["ct2"], strict=False)]
    print(f"{model.check.label} greedy tokens, ours vs CTranslate2: {sum(same)} of {len(same)} prompts agree "
          f"(prompt lengths {[len(p) for p in prompts]})", flush=True)
    return {"agree": all(same), "prompts_agreeing": sum(same), "prompts": len(same),
            "prompt_tokens": [len(p) for p in prompts], "tokens": tokens}
