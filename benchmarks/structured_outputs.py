"""What a JSON schema costs a generator: time per output token with and without one, at 1 and 16 concurrent
rows, and the time to compile a schema (the first request that brings it, and a second, cached). The engine
runs in process on the committed generator (--artifacts), so the figures are the engine's, not HTTP's.

    python -m benchmarks.structured_outputs [--artifacts artifacts] [--concurrency 1,16] [--tokens 128]
                                            [--rounds 3] [--threads 2] [--out bench_results/structured_outputs.json]

Each row generates `--tokens` tokens: free rows with ignore_eos, constrained rows under a schema whose one
string field has no length limit, which the rows close as their budget ends (their last tokens are then the
structure's closing ones). The two kinds alternate within each round; medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from benchmarks.options import measurement_options
from benchmarks.record import write_record
from service.engine.engine import Engine
from service.engine.tasks.generation.constraints import Constraint
from service.engine.tasks.generation.service import GenerationJob, GenerationService
from service.engine.tokens.sampling import SamplingParams
from service.settings import Settings

SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
# Schemas of growing size for the compile timings: n required integer fields.
COMPILE_SIZES = (1, 10, 50)


def _job(constrained: bool, tokens: int, seed: int) -> GenerationJob:
    constraint = Constraint("json", SCHEMA, "response_format") if constrained else None
    return GenerationJob(["Once upon a time"], ["prompt"], max_new_tokens=tokens, ignore_eos=not constrained,
                         sampling=SamplingParams(temperature=1.0, seed=seed), constraint=constraint)


async def per_token_ms(engine: Engine, constrained: bool, concurrency: int, tokens: int) -> float:
    """Wall time per generated token of one row, with `concurrency` rows decoding together."""
    started = time.perf_counter()
    handles = [await engine.submit(_job(constrained, tokens, seed)) for seed in range(concurrency)]
    results = [r for h in handles for r in await h.results()]
    elapsed = time.perf_counter() - started
    generated = sum(r.completion_tokens for r in results) / concurrency
    return 1000 * elapsed / generated


def compile_ms(generator: GenerationService, fields: int) -> tuple[float, float]:
    """The first compile of a schema of `fields` required integers, and the second (from the cache)."""
    schema = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(fields)},
              "required": [f"f{i}" for i in range(fields)]}
    times = []
    for _ in range(2):
        started = time.perf_counter()
        generator.model.grammars.compile(Constraint("json", schema, "response_format"))
        times.append(1000 * (time.perf_counter() - started))
    return times[0], times[1]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(artifacts_dir=args.artifacts, models=["generator"], intra_op_threads=args.threads,
                        inter_op_threads=1, max_new_tokens=max(args.tokens, 256))
    engine = Engine(settings)
    engine.load()
    await engine.start()
    try:
        generator = engine.services["generator"]
        assert isinstance(generator, GenerationService)
        compiles = {n: compile_ms(generator, n) for n in COMPILE_SIZES}
        levels = [int(c) for c in args.concurrency.split(",")]
        cells: dict[tuple[int, bool], list[float]] = {(c, k): [] for c in levels for k in (False, True)}
        await per_token_ms(engine, True, 1, 16)  # warm up both paths
        await per_token_ms(engine, False, 1, 16)
        for round_ in range(args.rounds):
            for concurrency in levels:
                for constrained in (False, True) if round_ % 2 == 0 else (True, False):
                    cells[concurrency, constrained].append(
                        await per_token_ms(engine, constrained, concurrency, args.tokens))
        rows = []
        for concurrency in levels:
            free, schema = (statistics.median(cells[concurrency, k]) for k in (False, True))
            rows.append({"concurrency": concurrency, "free_ms_per_token": round(free, 3),
                         "schema_ms_per_token": round(schema, 3), "ratio": round(schema / free, 3)})
        return {"rows": rows, "compile_ms": {str(n): {"first": round(a, 2), "cached": round(b, 4)}
                                              for n, (a, b) in compiles.items()}}
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    measurement_options(parser, "structured_outputs", rounds=3)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print("| rows | ms/token free | ms/token with a schema | schema / free |\n|---|---|---|---|")
    for row in result["rows"]:
        print(f"| {row['concurrency']} | {row['free_ms_per_token']} | {row['schema_ms_per_token']} | {row['ratio']} |")
    print("\n| schema fields | first compile (ms) | cached (ms) |\n|---|---|---|")
    for fields, times in result["compile_ms"].items():
        print(f"| {fields} | {times['first']} | {times['cached']} |")
    options = (("concurrency", args.concurrency), ("tokens", args.tokens), ("rounds", args.rounds),
               ("threads", args.threads))
    write_record("benchmarks.structured_outputs", options, args.out, **result)


if __name__ == "__main__":
    main()
