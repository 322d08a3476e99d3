"""How often a seeded completion differs batched from alone, on the committed generator (docs/api.md, "Generate").

Every prompt of tests/clients/lm_eval_tasks/sotu_choice.jsonl, `--rounds` times with other seeds, is
sent as one n=2 completion, all at once (so rows of different lengths share batches), and each choice
again alone with its own seed. The figures go to bench_results/seeded_batching.json:

    python -m benchmarks.seeded_batching --rounds 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from service.app import create_app
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "tests" / "clients" / "lm_eval_tasks" / "sotu_choice.jsonl"
N = 2
CONCURRENCY = 16  # requests in flight: batches of up to 32 rows of 16 different prompts


async def measure(rounds: int, tokens: int, temperature: float) -> dict[str, Any]:
    settings = Settings(artifacts_dir=REPO / "artifacts", models=["generator"], intra_op_threads=1, warmup=False)
    prompts = [json.loads(line)["context"] for line in PROMPTS.read_text().splitlines()]
    tokenizer = Tokenizer.from_file(str(REPO / "artifacts" / "generator" / "tokenizer.json"))
    app = create_app(settings)
    base = {"model": "generator", "max_tokens": tokens, "temperature": temperature, "logprobs": 0, "ignore_eos": True}
    jobs = [(prompt, 3000 + 100 * j + 10_000 * r) for r in range(rounds) for j, prompt in enumerate(prompts)]
    async with app.router.lifespan_context(app):
        while not app.state.engine.ready:
            await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local", timeout=600) as client:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def together(prompt: str, seed: int) -> httpx.Response:
                async with gate:
                    answer = await client.post("/v1/completions", json={**base, "prompt": prompt, "n": N, "seed": seed})
                answer.raise_for_status()
                return answer

            batched = await asyncio.gather(*(together(p, s) for p, s in jobs))
            differences = []
            for (prompt, seed), answer in zip(jobs, batched, strict=True):
                for i, choice in enumerate(answer.json()["choices"]):
                    alone_body = {**base, "prompt": prompt, "seed": seed + i}
                    alone_answer = await client.post("/v1/completions", json=alone_body)
                    alone_answer.raise_for_status()
                    a, b = alone_answer.json()["choices"][0]["logprobs"], choice["logprobs"]
                    if a["tokens"] != b["tokens"]:
                        step = next(t for t, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=True)) if x != y)
                        ids = [tokenizer.encode(x["tokens"][step], add_special_tokens=False).ids for x in (a, b)]
                        differences.append({
                            "seed": seed + i,
                            "step": step,
                            "alone": {"token": a["tokens"][step], "ids": ids[0],
                                      "logprob": a["token_logprobs"][step]},
                            "batched": {"token": b["tokens"][step], "ids": ids[1],
                                        "logprob": b["token_logprobs"][step]},
                        })
    choices = len(jobs) * N
    return {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "temperature": temperature,
        "choices": choices,
        "tokens_per_choice": tokens,
        "sampled_tokens": choices * tokens,
        "differing_choices": len(differences),
        "first_differences": differences,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "seeded_batching.json")
    args = parser.parse_args()
    report = asyncio.run(measure(args.rounds, args.tokens, args.temperature))
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "first_differences"}))


if __name__ == "__main__":
    main()
