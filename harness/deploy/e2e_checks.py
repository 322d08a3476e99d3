"""The checks of `e2e.py check`: each calls the server's endpoints and checks real answers against
harness/deploy/expectations.json, or a consistency that holds for any model. Standard library only.

Every check is a method of EndpointChecks, registered with its line's name by @check in the order it runs;
`quick=True` puts it in the subset `--quick` runs (through the load balancer).
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy reads the repository as packages; the script imports its siblings from its own folder
    from harness.deploy.e2e_client import Client, Reply, collect_completion_stream, collect_generate_stream
else:
    from e2e_client import Client, Reply, collect_completion_stream, collect_generate_stream


class Checks:
    """Runs checks one after another: one line each, `ok` or `FAIL` with the exception, then a summary."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> None:
        started = time.perf_counter()
        try:
            note = fn()
        except Exception as exc:  # every failure is reported, then the next check runs
            self.failed.append(name)
            detail = "".join(traceback.format_exception_only(exc)).strip()
            print(f"FAIL {name}: {detail}", flush=True)
            return
        self.passed += 1
        took = time.perf_counter() - started
        note = note if not note or len(note) <= 160 else note[:157] + "..."
        print(f"ok   {name} ({took:.2f}s){': ' + note if note else ''}", flush=True)

    def finish(self) -> int:
        if self.failed:
            print("failed checks: " + ", ".join(self.failed))
        print(f"{self.passed} passed, {len(self.failed)} failed")
        return 1 if self.failed or not self.passed else 0


def has_words(text: str, words: list[str]) -> list[str]:
    """The expected words missing from text (whole words, case-insensitive)."""
    return [w for w in words if not re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text, re.IGNORECASE)]


def ok(reply: Reply, what: str) -> Any:
    assert reply.status == 200, f"{what}: HTTP {reply.status} {reply.body[:300]!r}"
    return reply.json()


def error_type(reply: Reply) -> str:
    return str(reply.json().get("error", {}).get("type"))


EndpointCheck = Callable[["EndpointChecks"], str]
# (the check's line, the check, whether --quick runs it), in the order they run.
REGISTERED: list[tuple[str, EndpointCheck, bool]] = []


def check(name: str, quick: bool = False) -> Callable[[EndpointCheck], EndpointCheck]:
    """Registers an EndpointChecks method as the check `name`."""

    def register(fn: EndpointCheck) -> EndpointCheck:
        REGISTERED.append((name, fn, quick))
        return fn

    return register


class EndpointChecks:
    """The checks of one server; `exp` is expectations.json. Each check returns the note its line shows."""

    def __init__(self, client: Client, exp: dict[str, Any]) -> None:
        assert exp["translate"] and exp["classify"], "expectations.json needs translation and classification cases"
        self.client, self.exp = client, exp
        self.gen: dict[str, Any] = exp["generate"]
        self.greedy = {"prompt": self.gen["prompt"], "max_new_tokens": self.gen["max_new_tokens"], "temperature": 0.0}

    def one_by_one(self, cases: list[dict[str, Any]], path: str, key: str) -> Iterator[tuple[dict[str, Any], Any]]:
        """Each case's text in a request of its own: the case, and the one result under `key`."""
        for case in cases:
            (result,) = ok(self.client.post(path, {"text": case["text"]}), path)[key]
            yield case, result

    @check("health + ready", quick=True)
    def health(self) -> str:
        assert ok(self.client.get("/health"), "/health") == {"status": "ok"}
        assert ok(self.client.get("/ready"), "/ready")["status"] == "ready"
        return "health ok, ready"

    @check("GET /v1/models", quick=True)
    def models(self) -> str:
        data = ok(self.client.get("/v1/models"), "/v1/models")
        cards = {card["id"]: card for card in data["data"]}
        assert set(self.exp["models"]) <= set(cards), f"served {sorted(cards)}, expected {self.exp['models']}"
        for card in cards.values():
            providers = set(card["provider"].values())
            assert providers == {self.exp["provider"]}, f"{card['id']} runs on {providers}"
        tasks = {card["id"]: card["task"] for card in cards.values()}
        return f"{tasks}, all on {self.exp['provider']}"

    @check("POST /v1/translate (expected French)", quick=True)
    def translate(self) -> str:
        outputs = []
        for case, result in self.one_by_one(self.exp["translate"], "/v1/translate", "translations"):
            missing = has_words(result["text"], case["expect_words"])
            assert not missing, f"{case['text']!r} -> {result['text']!r}: missing {missing}"
            outputs.append(result["text"])
        return " | ".join(outputs)

    @check("POST /v1/classify (expected labels)", quick=True)
    def classify(self) -> str:
        labels = []
        for case, result in self.one_by_one(self.exp["classify"], "/v1/classify", "results"):
            assert result["label"] == case["label"], f"{case['text']!r} -> {result['label']} ({result['scores']})"
            assert abs(sum(result["scores"].values()) - 1) < 1e-3, result["scores"]
            labels.append(f"{result['label']} {result['score']:.2f}")
        return ", ".join(labels)

    @check("POST /v1/embeddings (paraphrase retrieval)", quick=True)
    def embed(self) -> str:
        """The packaged all-MiniLM-L6-v2 embedder (its weights from the installed package): each query's
        paraphrase is its nearest document, through OpenAI's and TEI's routes alike."""
        case = self.exp["embed"]
        docs, queries = case["documents"], case["queries"]
        body = {"model": "embedder", "input": docs + queries}
        data = ok(self.client.post("/v1/embeddings", body), "/v1/embeddings")
        vectors = [item["embedding"] for item in sorted(data["data"], key=lambda item: item["index"])]
        assert all(len(v) == case["dimensions"] for v in vectors), [len(v) for v in vectors]
        doc_vectors, query_vectors = vectors[: len(docs)], vectors[len(docs) :]
        for q, (query, target) in enumerate(zip(queries, case["nearest"], strict=True)):
            sims = [sum(a * b for a, b in zip(query_vectors[q], d, strict=True)) for d in doc_vectors]
            assert max(range(len(docs)), key=sims.__getitem__) == target, (query, sims)
        tei = ok(self.client.post("/embed", {"inputs": queries[0]}), "/embed")
        assert max(abs(a - b) for a, b in zip(tei[0], query_vectors[0], strict=True)) < 1e-5
        return f"{len(queries)} queries find their paraphrase among {len(docs)} documents; /embed agrees"

    @check("POST /v1/generate stream=true", quick=True)
    def generate_stream(self) -> str:
        whole = ok(self.client.post("/v1/generate", self.greedy), "/v1/generate")
        tokens, done = collect_generate_stream(self.client, self.greedy)
        streamed = "".join(t["text"] for t in tokens)
        assert done["text"] == whole["text"], f"stream {done['text']!r} != whole {whole['text']!r}"
        assert streamed == done["text"], f"token texts {streamed!r} != done text {done['text']!r}"
        assert done["usage"]["completion_tokens"] == len(tokens), (done["usage"], len(tokens))
        assert done["finish_reason"] == whole["finish_reason"]
        return f"{len(tokens)} token events + done, same text as without streaming"

    @check("POST /v1/completions + stream", quick=True)
    def completions(self) -> str:
        body = {"model": "generator", "prompt": self.gen["prompt"], "max_tokens": self.gen["max_new_tokens"],
                "temperature": 0}
        data = ok(self.client.post("/v1/completions", body), "/v1/completions")
        assert data["object"] == "text_completion" and data["model"] == "generator"
        (choice,) = data["choices"]
        whole = ok(self.client.post("/v1/generate", self.greedy), "/v1/generate")
        assert choice["text"] == whole["text"], f"completions {choice['text']!r} != generate {whole['text']!r}"
        assert data["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
        text, finish = collect_completion_stream(self.client, body)
        assert text == choice["text"], f"streamed {text!r} != {choice['text']!r}"
        assert finish == choice["finish_reason"], (finish, choice["finish_reason"])
        return f"finish_reason {finish}; streamed = whole = /v1/generate; ends with [DONE]"

    @check("POST /v1/translate batch, beams, n_best")
    def translate_batch_nbest(self) -> str:
        texts = [case["text"] for case in self.exp["translate"]]
        body = {"text": texts, "num_beams": 4, "n_best": 2}
        data = ok(self.client.post("/v1/translate", body), "/v1/translate batch")
        assert len(data["translations"]) == len(texts)
        for case, result in zip(self.exp["translate"], data["translations"], strict=True):
            assert not has_words(result["text"], case["expect_words"]), f"batch: {result['text']!r}"
            scores = [h["score"] for h in result["n_best"]]
            assert len(scores) == 2 and scores == sorted(scores, reverse=True), scores
            assert result["text"] == result["n_best"][0]["text"]
        greedy = ok(self.client.post("/v1/translate", {"text": texts[0], "num_beams": 1}), "/v1/translate greedy")
        return f"{len(texts)} texts, n_best 2; greedy: {greedy['translations'][0]['text']!r}"

    @check("POST /v1/classify batch + pair")
    def classify_batch_pairs(self) -> str:
        texts = [case["text"] for case in self.exp["classify"]]
        pair = [texts[0], texts[-1]]
        data = ok(self.client.post("/v1/classify", {"text": [*texts, pair], "top_k": 2}), "/v1/classify batch")
        results = data["results"]
        assert len(results) == len(texts) + 1
        for case, result in zip(self.exp["classify"], results, strict=False):
            assert result["label"] == case["label"], f"batched {case['text']!r} -> {result['label']}"
        assert results[-1]["top_k"][0]["label"] == results[-1]["label"]
        return f"{len(texts)} texts + 1 pair"

    @check("POST /v1/generate greedy")
    def generate(self) -> str:
        first = ok(self.client.post("/v1/generate", self.greedy), "/v1/generate")
        again = ok(self.client.post("/v1/generate", self.greedy), "/v1/generate")
        assert first["text"] == again["text"], "greedy decoding is not repeatable"
        assert first["finish_reason"] in ("eos", "length", "stop")
        assert 0 < first["usage"]["completion_tokens"] <= self.gen["max_new_tokens"], first["usage"]
        missing = has_words(first["text"], self.gen.get("expect_words", []))
        assert not missing, f"{self.gen['prompt']!r} -> {first['text']!r}: missing {missing}"
        return repr(self.gen["prompt"] + first["text"])

    @check("POST /v1/generate seeded sampling")
    def generate_sampling(self) -> str:
        body = {"prompt": self.gen["prompt"], "max_new_tokens": 12, "temperature": 0.8, "top_k": 40, "top_p": 0.95,
                "repetition_penalty": 1.1, "seed": 1234, "ignore_eos": True}
        a = ok(self.client.post("/v1/generate", body), "/v1/generate sampled")
        b = ok(self.client.post("/v1/generate", body), "/v1/generate sampled")
        assert a["text"] == b["text"] and a["seed"] == 1234, "the same seed gave different samples"
        assert a["usage"]["completion_tokens"] == 12 and a["finish_reason"] == "length", a
        return repr(a["text"])

    @check("error responses")
    def errors(self) -> str:
        bad = self.client.post("/v1/translate", {"txt": "hello"})
        assert bad.status == 422, bad.status
        assert self.client.call("POST", "/v1/classify", raw=b"{not json").status == 400
        unknown = self.client.post("/v1/completions", {"model": "no-such-model", "prompt": "x"})
        assert unknown.status == 404, unknown.status
        # A budget beyond the context is clamped (SERVE_STRICT_MAX_TOKENS=false); a prompt beyond it is refused.
        too_long = self.client.post("/v1/generate", {"prompt": self.gen["prompt"] * 2000, "max_new_tokens": 8})
        assert too_long.status == 422, too_long.status
        clamped = self.client.post("/v1/generate", {"prompt": self.gen["prompt"], "max_new_tokens": 10**6})
        assert clamped.status == 200 and clamped.json()["finish_reason"] in ("length", "eos"), clamped.status
        return f"422 {error_type(bad)}, 400 bad JSON, 404 {error_type(unknown)}, 422 {error_type(too_long)}"

    @check("GET /metrics")
    def metrics(self) -> str:
        reply = self.client.get("/metrics")
        assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain"), reply.status
        for name in self.exp["metrics"]:
            assert re.search(rf"^{name}\b", reply.text, re.MULTILINE), f"metric {name} missing"
        served = re.search(
            r'^serve_requests_total\{endpoint="/v1/translate",status="200"\} (\S+)', reply.text, re.MULTILINE
        )
        assert served and float(served.group(1)) >= 1, "translate requests not counted"
        return f"{len(self.exp['metrics'])} metrics present; translate 200s: {served.group(1)}"

    @check("offline docs and playground")
    def docs_and_playground(self) -> str:
        """Built into the image: /docs, /redoc and the playground load nothing from outside."""
        fetched = 0
        for page in ("/docs", "/redoc", "/playground"):
            reply = self.client.get(page)
            assert reply.status == 200, f"{page}: HTTP {reply.status}"
            pattern = r"""(?:src|href)=["']([^"']+)["']|url: ["']([^"']+)["']"""
            urls = [a or b for a, b in re.findall(pattern, reply.text)]
            external = [u for u in urls if u.startswith(("http:", "https:", "//"))]
            assert not external, f"{page} loads {external}"
            for url in (u for u in urls if u.startswith("/")):
                assert self.client.get(url).status == 200, f"{page}: {url} is missing"
                fetched += 1
        return f"/docs, /redoc, /playground and {fetched} assets, all local"

    @check("client protocols (TGI, HF, tokenizer, scoring)")
    def client_protocols(self) -> str:
        """TGI, Inference API, vLLM tokenizer and OpenAI scoring routes, as the clients call them."""
        tgi_body = {"inputs": self.gen["prompt"], "parameters": {"max_new_tokens": self.gen["max_new_tokens"]}}
        tgi = ok(self.client.post("/generate", tgi_body), "/generate")
        whole = ok(self.client.post("/v1/generate", self.greedy), "/v1/generate")
        assert tgi["generated_text"] == whole["text"], (tgi, whole["text"])
        body = {"model": "generator", "prompt": self.gen["prompt"], "max_tokens": 0, "echo": True, "logprobs": 1}
        logprobs = ok(self.client.post("/v1/completions", body), "/v1/completions echo")["choices"][0]["logprobs"]
        assert logprobs["token_logprobs"][0] is None and all(x < 0 for x in logprobs["token_logprobs"][1:])
        info = ok(self.client.get("/tokenizer_info"), "/tokenizer_info")
        eos_body = {"prompt": info["eos_token"], "add_special_tokens": False}
        eos = ok(self.client.post("/tokenize", eos_body), "/tokenize")
        assert eos["count"] == 1, eos
        case = self.exp["classify"][0]
        ranked = ok(self.client.post("/models/classifier", {"inputs": case["text"]}), "/models/classifier")
        assert ranked[0][0]["label"] == case["label"], ranked
        return f"TGI = /v1/generate, prompt scored ({len(logprobs['tokens'])} tokens), /tokenize, HF classification"


def check_all(client: Client, exp: dict[str, Any], quick: bool) -> int:
    """Every registered check in turn (the quick ones only with `quick`); 1 if any failed."""
    checks = Checks()
    endpoints = EndpointChecks(client, exp)
    for name, fn, in_quick in REGISTERED:
        if in_quick or not quick:
            checks.run(name, partial(fn, endpoints))
    return checks.finish()
