"""What list bombs do to the event loop: /health latency while N concurrent bodies each carry one list (or
object) of 100,000 items, under the body limit, on every route that takes one, on a real `python -m service`
(the committed artifacts, the reliability suite's settings).

    python -m benchmarks.list_bombs                       # every bomb, 8 at once, 100,000 items
    python -m benchmarks.list_bombs --only embeddings --only embed --concurrency 8 --items 100000

/health is timed from a process of its own, every 10 ms (a client that writes megabytes in the same
event loop would time itself). Prints one JSON line per bomb: the statuses, the burst's wall time, the
worst /health time, and the start of the first answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from harness.reliability.harness import LocalServer, health_timer

Body = Callable[[int], Any]


def _strs(n: int) -> list[str]:
    return ["x"] * n


# name -> (path, body of n items): each list (or object) field a route takes, filled with items that
# are wrong for a token-id list and (for the ones that take texts) right for a text list.
BOMBS: dict[str, tuple[str, Body]] = {
    "embeddings": ("/v1/embeddings", lambda n: {"input": _strs(n)}),
    "embeddings_ids": ("/v1/embeddings", lambda n: {"input": [[0]] * n}),
    "embed": ("/embed", lambda n: {"inputs": _strs(n)}),
    "rerank": ("/rerank", lambda n: {"query": "q", "texts": _strs(n)}),
    "classify": ("/v1/classify", lambda n: {"text": _strs(n)}),
    "classify_pairs": ("/v1/classify", lambda n: {"text": [["a", "b"]] * n}),
    "completions": ("/v1/completions", lambda n: {"model": "generator", "prompt": _strs(n)}),
    "completions_ids": ("/v1/completions", lambda n: {"model": "generator", "prompt": [[0]] * n}),
    "completions_stop": ("/v1/completions", lambda n: {"model": "generator", "prompt": "a", "stop": _strs(n)}),
    "logit_bias": (
        "/v1/completions",
        lambda n: {"model": "generator", "prompt": "a", "logit_bias": {str(i): "x" for i in range(min(n, 70_000))}},
    ),
    "chat_messages": ("/v1/chat/completions", lambda n: {"messages": _strs(n)}),
    "chat_parts": ("/v1/chat/completions", lambda n: {"messages": [{"role": "user", "content": _strs(n)}]}),
    "chat_tools": (
        "/v1/chat/completions",
        lambda n: {"messages": [{"role": "user", "content": "a"}], "tools": _strs(n)},
    ),
    "translate": ("/v1/translate", lambda n: {"text": _strs(n)}),
    "generate": ("/v1/generate", lambda n: {"prompt": _strs(n)}),
    "generate_ids": ("/v1/generate", lambda n: {"prompt": [1] * n}),
    "generate_stop": ("/v1/generate", lambda n: {"prompt": "a", "stop": _strs(n)}),
    "tgi_stop": ("/generate", lambda n: {"inputs": "a", "parameters": {"stop": _strs(n)}}),
    "tgi_stream_stop": ("/generate_stream", lambda n: {"inputs": "a", "parameters": {"stop": _strs(n)}}),
    "hf_root": ("/", lambda n: {"inputs": _strs(n)}),
    "hf_classifier": ("/models/classifier", lambda n: {"inputs": _strs(n)}),
    "hf_classifier_ids": ("/models/classifier", lambda n: {"inputs": [[0]] * n}),
    "hf_translator": ("/models/translator", lambda n: {"inputs": _strs(n)}),
    "hf_embedder": ("/models/embedder", lambda n: {"inputs": _strs(n)}),
    "hf_similarity": ("/models/embedder", lambda n: {"inputs": {"source_sentence": "a", "sentences": _strs(n)}}),
    "hf_pipeline": ("/models/classifier/pipeline/text-classification", lambda n: {"inputs": _strs(n)}),
    "tokenize": ("/tokenize", lambda n: {"prompt": _strs(n)}),
    "tokenize_ids": ("/tokenize", lambda n: {"prompt": [[0]] * n}),
    "detokenize": ("/detokenize", lambda n: {"tokens": _strs(n)}),
    "detokenize_ids": ("/detokenize", lambda n: {"tokens": [1] * n}),
}

async def bomb(url: str, name: str, concurrency: int, items: int) -> dict[str, Any]:
    path, make = BOMBS[name]
    content = json.dumps(make(items)).encode()
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        await http.get("/health")
        with health_timer(url, every_s=0.01, limit_s=120) as worst:
            await asyncio.sleep(0.05)
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(http.post(path, content=content, headers=headers) for _ in range(concurrency))
            )
            burst_s = time.perf_counter() - started
    return {
        "bomb": name,
        "path": path,
        "body_kb": round(len(content) / 1024),
        "statuses": dict(Counter(r.status_code for r in answers)),
        "burst_s": round(burst_s, 3),
        "health_worst_ms": round(1000 * worst[0], 1),
        "answer_bytes": len(answers[0].content),
        "answer": answers[0].text[:240],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(BOMBS), help="these bombs (default: all)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--setting", action="append", default=[], help="NAME=VALUE for the server")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.setting)
    with LocalServer(**settings) as server:
        server.wait_ready(timeout=300)
        for name in args.only or list(BOMBS):
            print(json.dumps(asyncio.run(bomb(server.url, name, args.concurrency, args.items))), flush=True)


if __name__ == "__main__":
    main()
