"""The load section's requests, each one whose answer must not depend on what else the server is doing
(greedy, beams, classification, embeddings, reranking; seeded sampling within what docs/api.md "Generate"
states), and what of each answer must be identical: its key (texts, tokens, labels) and its scores (which
may differ in the last bits). A stream's key is its events assembled."""

from __future__ import annotations

import json
from typing import Any

import httpx

from harness.reliability.harness import model_ids, served, sse_events
from harness.reliability.suite_models import CHAT, RERANKER

Request = tuple[str, dict[str, Any]]

PROMPTS = ("The Congress of the United", "Fellow citizens", "In the beginning", "The president said", "We the people")
SENTENCES = (
    "God said, Let there be light.",
    "And there was light.",
    "The king went to the city.",
    "In the beginning God created the heavens and the earth.",
)
REVIEWS = ("A wonderful, moving film.", "A dull, boring mess.", "The plot is thin but the acting is great.")


# A seeded draw may differ batched vs alone where the logits' batch-shape rounding (~1e-5) moves its
# random number across a boundary onto a neighbouring id (docs/api.md, "Generate"): measured 5 in 512 64-token
# completions (benchmarks/seeded_batching.py). Seeded answers may differ at most this often, and only there.
SEEDED_FLIP_RATE = 0.05
NEIGHBOUR_IDS = 8


def deterministic_requests(ids: dict[str, str]) -> list[Request]:
    """Requests whose answer must not depend on what else is in the batch (greedy, beams, classification),
    and seeded sampling, which may differ only as docs/api.md "Generate" states (`seeded_flip`)."""
    reqs: list[Request] = []
    if "generation" in ids:
        for i, p in enumerate(PROMPTS):
            reqs.append(("/v1/generate", {"prompt": p, "max_new_tokens": 6 + 3 * i, "temperature": 0}))
            reqs.append(("/v1/generate", {"prompt": p, "max_new_tokens": 10, "seed": 100 + i, "top_k": 40,
                                            "logprobs": True}))
            reqs.append(("/v1/completions", {"model": ids["generation"], "prompt": p, "max_tokens": 8, "seed": 7 + i}))
    if "translation" in ids:
        for s in SENTENCES:
            reqs.append(("/v1/translate", {"text": s, "num_beams": 1, "max_new_tokens": 16}))
            reqs.append(("/v1/translate", {"text": s, "num_beams": 2, "max_new_tokens": 12}))
    if "classification" in ids:
        for r in REVIEWS:
            reqs.append(("/v1/classify", {"text": r}))
        reqs.append(("/v1/classify", {"text": [[REVIEWS[2], REVIEWS[0]], REVIEWS[1]], "top_k": 2}))
    return reqs


def seeded(body: dict[str, Any]) -> bool:
    return "seed" in body and body.get("temperature") != 0


def seeded_flip(request: dict[str, Any], alone: Any, batched: Any) -> bool:
    """Whether a seeded answer differs from its solo one as the guarantee allows: at a first differing
    token whose ids are vocabulary neighbours (where token ids are returned; else any difference)."""
    if not seeded(request):
        return False
    if isinstance(alone, tuple) and len(alone) == 4:  # /v1/generate with logprobs: its token ids
        first = next((i for i, (a, b) in enumerate(zip(alone[3], batched[3], strict=False)) if a != b), None)
        return first is not None and abs(alone[3][first] - batched[3][first]) <= NEIGHBOUR_IDS
    return True


def answer_key(path: str, body: dict[str, Any]) -> tuple[Any, list[float]]:
    """What must be identical (texts, tokens, labels) and the scores that may differ in the last bits."""
    if path == "/v1/generate":
        ids = tuple(t["id"] for t in body["tokens"]) if body.get("tokens") is not None else None
        key = (body["text"], body["finish_reason"], body["usage"]["completion_tokens"])
        return ((*key, ids) if ids is not None else key), []
    if path == "/v1/completions":
        return [(c["text"], c["finish_reason"]) for c in body["choices"]], []
    if path in ("/v1/chat/completions", "/v1/embeddings", "/embed", "/rerank"):
        return route_key(path, body)
    if path == "/v1/translate":
        return [t["text"] for t in body["translations"]], [t["score"] for t in body["translations"]]
    return [r["label"] for r in body["results"]], [p for r in body["results"] for p in r["scores"].values()]


QUESTIONS = (
    [{"role": "user", "content": "Where is the train station?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What time is it?"}],
    [{"role": "developer", "content": "Be polite."},
     {"role": "user", "content": [{"type": "text", "text": "Thanks! "}, {"type": "text", "text": "And the museum?"}]}],
)  # fmt: skip


def route_requests(ids: dict[str, str], models: set[str]) -> list[Request]:
    """Chat (streamed and not), /v1/embeddings, /embed and /rerank, where their models are served."""
    reqs: list[Request] = []
    if CHAT in models:
        for i, messages in enumerate(QUESTIONS):
            greedy = {"model": CHAT, "messages": messages, "max_tokens": 6 + 2 * i, "temperature": 0}
            reqs.append(("/v1/chat/completions", greedy))
            reqs.append(("/v1/chat/completions", greedy | {"stream": True}))
            seeded_chat = {"model": CHAT, "messages": messages, "max_tokens": 8, "seed": 11 + i, "n": 2}
            reqs.append(("/v1/chat/completions", seeded_chat))
            reqs.append(("/v1/chat/completions", seeded_chat | {"stream": True,
                                                                "stream_options": {"include_usage": True}}))
    if "embedding" in ids:
        for i, s in enumerate(SENTENCES):
            reqs.append(("/v1/embeddings", {"input": s if i % 2 else [s, REVIEWS[i % 3]]}))
            reqs.append(("/embed", {"inputs": [s, *REVIEWS[: i + 1]]}))
    if RERANKER in models:
        for i, q in enumerate(PROMPTS[:3]):
            reqs.append(("/rerank", {"query": q, "texts": [*REVIEWS, *SENTENCES[: i + 1]], "return_text": i == 0}))
    return reqs


async def catalogue(http: httpx.AsyncClient) -> list[Request]:
    """Every request of the load section that the server's models can answer."""
    ids = await model_ids(http)
    return deterministic_requests(ids) + route_requests(ids, await served(http))


def route_key(path: str, body: Any) -> tuple[Any, list[float]]:
    """answer_key of the routes route_requests sends (not streamed)."""
    if path == "/v1/chat/completions":
        return [(c["message"]["content"], c["finish_reason"]) for c in body["choices"]], []
    if path == "/v1/embeddings":
        data = body["data"]
        return [(d["index"], len(d["embedding"])) for d in data], [x for d in data for x in d["embedding"]]
    if path == "/embed":
        return [len(v) for v in body], [x for v in body for x in v]
    ranks = sorted(body, key=lambda r: r["index"])  # /rerank: best first; near ties may swap, their scores may not
    return [(r["index"], r.get("text")) for r in ranks], [r["score"] for r in ranks]


def stream_key(events: list[str]) -> Any:
    """A chat stream's key: each choice's text and finish reason, its usage, and whether [DONE] ended it."""
    chunks = [json.loads(data) for data in events if data != "[DONE]"]
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (choice["delta"].get("content") or "")
            finish[choice["index"]] = choice.get("finish_reason") or finish.get(choice["index"])
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    return sorted(texts.items()), sorted(finish.items()), usage, events[-1:] == ["[DONE]"]


async def answer(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, Any, list[float], str]:
    """Send one request: its status and, for a 200, its key and scores (else the start of its body)."""
    if body.get("stream"):
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                return response.status_code, None, [], (await response.aread()).decode("utf-8", "replace")[:200]
            return 200, stream_key([data for _, data in await sse_events(response)]), [], ""
    response = await http.post(path, json=body)
    if response.status_code != 200:
        return response.status_code, None, [], response.text[:200]
    key, scores = answer_key(path, response.json())
    return 200, key, scores, ""
