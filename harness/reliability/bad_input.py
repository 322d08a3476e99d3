"""Malformed and unsupported inputs, on every route family (native, OpenAI completions and chat, embeddings,
TGI, TEI's /embed and /rerank): each must get a 4xx in the error shape of its route, never a 5xx, and the
server must stay healthy after each."""

from __future__ import annotations

import json
from typing import Any

import httpx

from harness.reliability.harness import Outcome, Target, client, error_shaped, model_ids, timed

Case = tuple[str, str, Any, dict[str, str]]
JSON = {"content-type": "application/json"}
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

def _chunks(data: bytes, size: int = 65536) -> Any:
    async def gen() -> Any:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return gen()


def bad_inputs(generator: str) -> list[Case]:
    """(name, path, body, headers): each must get a 4xx in our error shape. `body` is bytes, or an async
    iterator of bytes (a chunked body). Raw bytes where they are what the case is about (not JSON, not
    UTF-8, numbers and nesting json.dumps would not write); JSON bodies through _case."""
    big = b'{"text": "' + b"a" * (20 << 20) + b'"}'

    def biased(logit_bias: dict[str, int]) -> dict[str, Any]:
        return {"model": generator, "prompt": "hi", "max_tokens": 2, "logit_bias": logit_bias}

    cases: list[Case] = [
        ("invalid JSON", "/v1/classify", b'{"text": ', JSON),
        ("invalid UTF-8", "/v1/classify", b'{"text": "\xff\xfe bad"}', JSON),
        ("lone surrogate", "/v1/classify", b'{"text": "\\ud800"}', JSON),
        ("lone surrogate (generate)", "/v1/generate", b'{"prompt": "a\\udfff b", "max_new_tokens": 2}', JSON),
        ("lone surrogate (translate)", "/v1/translate", b'{"text": "\\udc00", "num_beams": 1}', JSON),
        ("NaN", "/v1/generate", b'{"prompt": "hi", "temperature": NaN}', JSON),
        ("Infinity", "/v1/generate", b'{"prompt": "hi", "top_p": Infinity}', JSON),
        ("-Infinity", "/v1/translate", b'{"text": "hi", "length_penalty": -Infinity}', JSON),
        ("deep nesting", "/v1/classify", b"[" * 100_000 + b"]" * 100_000, JSON),
        ("deep nesting in a field", "/v1/classify", b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", JSON),
        ("huge integer", "/v1/generate", b'{"prompt": "hi", "seed": 1' + b"0" * 5000 + b"}", JSON),
        ("huge float", "/v1/generate", b'{"prompt": "hi", "max_new_tokens": 1e400}', JSON),
        _case("int64 overflow", "/v1/generate", {"prompt": "hi", "seed": 99999999999999999999999}),
        _case("token id out of vocabulary", "/v1/generate", {"prompt": [1, 99999999], "max_new_tokens": 2}),
        _case("token id beyond int64", "/v1/generate", {"prompt": [2**65]}),
        _case("top_k beyond int64", "/v1/generate", {"prompt": "hi", "max_new_tokens": 2, "top_k": 2**63}),
        _case("top_k beyond int64 (greedy)", "/v1/generate",
              {"prompt": "hi", "max_new_tokens": 2, "temperature": 0, "top_k": 2**63}),
        _case("top_k beyond int64 (completions)", "/v1/completions",
              {"model": generator, "prompt": "hi", "max_tokens": 2, "top_k": 2**63}),
        _case("top_k beyond int64 (translate)", "/v1/translate",
              {"text": "hi", "num_beams": 1, "do_sample": True, "top_k": 2**63}),
        _case("top_k beyond int64 (TGI)", "/generate",
              {"inputs": "hi", "parameters": {"max_new_tokens": 2, "top_k": 2**63}}),
        _case("negative token id", "/v1/completions", {"model": generator, "prompt": [-1]}),
        _case("logit_bias superscript key", "/v1/completions", biased({"²": 1})),
        _case("logit_bias Arabic-Indic key", "/v1/completions", biased({"١": 1})),
        _case("logit_bias 5,000-digit key", "/v1/completions", biased({"9" * 5000: 1})),
        _case("logit_bias id out of vocabulary", "/v1/completions", biased({"99999": 1})),
        _case("huge list", "/v1/classify", {"text": ["a"] * 100_000}),
        _case("huge stop list", "/v1/generate", {"prompt": "hi", "stop": ["x"] * 10_000}),
        ("20 MB body", "/v1/classify", big, JSON),
        ("20 MB chunked body", "/v1/classify", _chunks(big), JSON),
        ("chunked invalid JSON", "/v1/generate", _chunks(b'{"prompt": [' * 1000), JSON),
        ("empty body", "/v1/generate", b"", JSON),
        _case("JSON array", "/v1/generate", []),
        _case("JSON null", "/v1/translate", None),
        _case("unknown field", "/v1/generate", {"prompt": "hi", "bogus": 1}),
        _case("wrong type", "/v1/generate", {"prompt": 5}),
        ("text/plain body", "/v1/classify", b"hello", {"content-type": "text/plain"}),
        _case("empty text", "/v1/classify", {"text": ""}),
        _case("whitespace text", "/v1/translate", {"text": "   "}),
        _case("top_logprobs without logprobs", "/v1/generate", {"prompt": "hi", "top_logprobs": 3}),
        _case("stream with beams", "/v1/translate", {"text": "hi", "stream": True, "num_beams": 4}),
        _case("top_k above the labels", "/v1/classify", {"text": "hi", "top_k": 99}),
        _case("unknown model", "/v1/completions", {"model": "gpt-4", "prompt": "hi"}),
    ]  # fmt: skip
    return cases


def _case(name: str, path: str, body: Any) -> Case:
    return name, path, json.dumps(body).encode(), JSON


def _chat(name: str, **fields: Any) -> Case:
    return _case(f"chat: {name}", CHAT, {"messages": USER} | fields)


def _message(name: str, *messages: Any) -> Case:
    return _case(f"chat: {name}", CHAT, {"messages": list(messages)})


def chat_bad_inputs(generator: str) -> list[Case]:
    """Bad roles and contents, huge message lists, n out of range, tool calls and tool choices that name
    nothing or break the rules, response formats the server cannot build; the model named has no chat
    template or is not served."""
    return [
        _message("tool message without its call id", {"role": "tool", "content": "x"}),
        _message("tool_call_id on a user message", {"role": "user", "content": "x", "tool_call_id": "1"}),
        _message("tool_calls on a user message", {"role": "user", "content": "x", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
        _message("role function", {"role": "function", "content": "x", "name": "f"}),
        _message("role not a string", {"role": 5, "content": "x"}),
        _message("no role", {"content": "x"}),
        _message("no content", {"role": "user"}),
        _message("content null", {"role": "user", "content": None}),
        _message("content an object", {"role": "user", "content": {"text": "x"}}),
        _message("content a number", {"role": "user", "content": 5}),
        _message("image part", {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}),
        _message("audio part", {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}),
        _message("text part without text", {"role": "user", "content": [{"type": "text"}]}),
        _message("text part with another field", {"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}),
        _message("no content parts", {"role": "user", "content": []}),
        _message("assistant tool_calls without a function", {"role": "assistant", "content": None,
                                                               "tool_calls": [{"id": "1"}]}),
        _message("a message that is a string", "hi"),
        _message("no messages"),
        _case("chat: messages a string", CHAT, {"messages": "hi"}),
        _message("20,000 messages (past the context)", *[{"role": "user", "content": "x"}] * 20_000),
        _message("100,000 messages (past the body limit)", *[{"role": "user", "content": "x"}] * 100_000),
        _message("a message past the context", {"role": "user", "content": "a " * 5000}),
        ("chat: lone surrogate", CHAT, b'{"messages": [{"role": "user", "content": "\\udc00"}]}', JSON),
        _chat("n 0", n=0),
        _chat("n 1000", n=1000),
        _chat("n a string", n="2"),
        _chat("tool_choice required without tools", tool_choice="required"),
        _chat("tool_choice an unknown mode", tools=[TOOL], tool_choice="sometimes"),
        _chat("tool_choice naming no tool", tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        _chat("two tools of one name", tools=[TOOL, TOOL]),
        _chat("a tool name with spaces", tools=[{"type": "function", "function": {"name": "a b"}}]),
        _chat("a tool of another type", tools=[{"type": "retrieval", "function": {"name": "f"}}]),
        _chat("10,000 tools", tools=[TOOL] * 10_000),
        _chat("response_format of an unknown type", response_format={"type": "xml"}),
        _chat("response_format schema not an object", response_format={"type": "json_schema",
                                                                        "json_schema": {"name": "x", "schema": 5}}),
        _chat("top_logprobs without logprobs", top_logprobs=3),
        _chat("top_logprobs 21", logprobs=True, top_logprobs=21),
        _chat("max_tokens 0", max_tokens=0),
        _chat("temperature -1", temperature=-1),
        _chat("stop list of 10,000", stop=["x"] * 10_000),
        _chat("logit_bias out of vocabulary", logit_bias={"99999999": 1}),
        _chat("include_usage not a boolean", stream=True, stream_options={"include_usage": "yes"}),
        _chat("unknown model", model="gpt-4"),
        _chat("model without a chat template", model=generator),
        _chat("an embedding model", model="embedder"),
    ]  # fmt: skip


def embedding_bad_inputs(generator: str) -> list[Case]:
    """/v1/embeddings, /embed and /rerank: empty, mistyped and out-of-range inputs, too many of them, too
    long ones, options these models cannot honour."""
    emb, embed, rerank = "/v1/embeddings", "/embed", "/rerank"
    return [
        _case("embeddings: no input", emb, {}),
        _case("embeddings: input null", emb, {"input": None}),
        _case("embeddings: empty list", emb, {"input": []}),
        _case("embeddings: empty text", emb, {"input": ""}),
        _case("embeddings: an empty text in the list", emb, {"input": ["a", ""]}),
        _case("embeddings: empty id list", emb, {"input": [[]]}),
        _case("embeddings: nested lists", emb, {"input": [[["a"]]]}),
        _case("embeddings: token id out of vocabulary", emb, {"input": [[99999999]]}),
        _case("embeddings: negative token id", emb, {"input": [[-1]]}),
        _case("embeddings: more inputs than a request takes", emb, {"input": ["a"] * 3000}),
        _case("embeddings: input past the limit", emb, {"input": "a " * 5000}),
        _case("embeddings: encoding_format hex", emb, {"input": "a", "encoding_format": "hex"}),
        _case("embeddings: dimensions 0", emb, {"input": "a", "dimensions": 0}),
        _case("embeddings: more dimensions than the model's", emb, {"input": "a", "dimensions": 100_000}),
        _case("embeddings: unknown model", emb, {"input": "a", "model": "gpt-4"}),
        _case("embeddings: a generation model", emb, {"input": "a", "model": generator}),
        _case("embed: no inputs", embed, {}),
        _case("embed: empty list", embed, {"inputs": []}),
        _case("embed: empty text", embed, {"inputs": ""}),
        _case("embed: a number", embed, {"inputs": 5}),
        _case("embed: negative token id", embed, {"inputs": [[-1]]}),
        _case("embed: more inputs than a request takes", embed, {"inputs": ["a"] * 3000}),
        _case("embed: input past the limit", embed, {"inputs": "a " * 5000}),
        _case("embed: prompt_name", embed, {"inputs": "a", "prompt_name": "query"}),
        _case("embed: truncation_direction middle", embed, {"inputs": "a", "truncation_direction": "middle"}),
        _case("embed: dimensions 0", embed, {"inputs": "a", "dimensions": 0}),
        _case("rerank: no query", rerank, {"texts": ["a"]}),
        _case("rerank: empty query", rerank, {"query": "", "texts": ["a"]}),
        _case("rerank: no texts", rerank, {"query": "q", "texts": []}),
        _case("rerank: texts a string", rerank, {"query": "q", "texts": "a"}),
        _case("rerank: a text that is a number", rerank, {"query": "q", "texts": [5]}),
        _case("rerank: an empty text", rerank, {"query": "q", "texts": ["a", ""]}),
        _case("rerank: more texts than a request takes", rerank, {"query": "q", "texts": ["a"] * 3000}),
        _case("rerank: query past the limit", rerank, {"query": "q " * 5000, "texts": ["a"]}),
        _case("rerank: raw_scores a string", rerank, {"query": "q", "texts": ["a"], "raw_scores": "yes"}),
        ("rerank: lone surrogate", rerank, b'{"query": "q", "texts": ["\\ud800"]}', JSON),
        ("embed: invalid JSON", embed, b'{"inputs": ', JSON),
    ]  # fmt: skip


async def _send(http: httpx.AsyncClient, out: Outcome, case: Case) -> int | None:
    """One case: its status (None where no answer came), failures into `out`, /health asked after it."""
    name, path, body, headers = case
    try:
        response = await http.post(path, content=body, headers=headers)
    except httpx.HTTPError as exc:
        out.failures.append(f"{name}: no response ({type(exc).__name__})")
        return None
    try:
        shaped = error_shaped(path, response.json())
    except ValueError:
        shaped = False
    out.check(400 <= response.status_code < 500, f"{name}: status {response.status_code} {response.text[:200]}")
    out.check(shaped, f"{name}: not the error shape: {response.text[:200]}")
    health = await http.get("/health")
    out.check(health.status_code == 200, f"{name}: /health {health.status_code} afterwards")
    return response.status_code


@timed("bad_input")
async def bad_input(target: Target) -> Outcome:
    out = Outcome("bad_input")
    statuses: dict[str, int] = {}
    async with client(target.url, connections=4) as http:
        generator = (await model_ids(http)).get("generation", "generator")
        cases = bad_inputs(generator) + chat_bad_inputs(generator) + embedding_bad_inputs(generator)
        for case in cases:
            status = await _send(http, out, case)
            if status is not None:
                statuses[case[0]] = status
    families = {"chat": ("chat: ",), "embeddings": ("embeddings: ", "embed: ", "rerank: ")}
    out.figures = {
        "cases": len(statuses),
        "statuses": dict(sorted({s: list(statuses.values()).count(s) for s in statuses.values()}.items())),
        "by_family": {f: sum(n.startswith(p) for n in statuses) for f, p in families.items()},
    }
    return out
