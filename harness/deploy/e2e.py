"""End-to-end checks of a running server (the real container in harness/deploy/run.sh). Standard library only.

    python harness/deploy/e2e.py check --url http://127.0.0.1:8000 [--quick]
    python harness/deploy/e2e.py drain --url http://127.0.0.1:8000 --container CONTAINER_ID

`check` calls every endpoint and checks real answers: known sentences translate to the expected French
words and reviews classify as expected (harness/deploy/expectations.json; adjust it when the models are
retrained, never empty it), plus consistency checks that hold for any model: streamed text equals the
whole response, greedy decoding repeats, a seed reproduces a sample, completions match generate.
`--quick` runs a subset (used through the load balancer).

`drain` starts several streamed generations, sends SIGTERM to the container (Docker's kill API on the
engine's socket, as `docker kill --signal TERM` does; the CLI for an engine reached otherwise) while they
are in flight, checks that the server is draining (/ready and new requests 503, the in-flight gauge above 0)
and that every stream still completes in full.

Prints one line per check and a closing `N passed, N failed`; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_SOCKET = "unix:///var/run/docker.sock"


# --- HTTP ----------------------------------------------------------------------------------------------


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


class Client:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _request(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> urllib.request.Request:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + path, data=data, method=method, headers=headers)

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Reply:
        try:
            with urllib.request.urlopen(self._request(method, path, body, raw), timeout=self.timeout) as r:
                return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
        except urllib.error.HTTPError as e:
            return Reply(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())

    def get(self, path: str) -> Reply:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> Reply:
        return self.call("POST", path, body)

    def stream(self, path: str, body: Any) -> Iterator[tuple[str | None, str]]:
        """Server-sent events as (event name or None, data), read as they arrive."""
        with urllib.request.urlopen(self._request("POST", path, body), timeout=self.timeout) as r:
            ctype = r.headers.get("content-type", "")
            assert ctype.startswith("text/event-stream"), f"{path}: content-type {ctype!r}"
            event: str | None = None
            data: list[str] = []
            for raw_line in r:
                line = raw_line.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, "\n".join(data)
                    event, data = None, []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))


def docker_kill(container: str, signal: str = "SIGTERM") -> None:
    """POST /containers/{id}/kill on the engine's socket (DOCKER_HOST, else Docker's default): `docker kill
    --signal` without a CLI start-up; the CLI (DOCKER) for an engine that is not a local socket."""
    host = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    path = host.removeprefix("unix://")
    if not host.startswith("unix://") or not os.path.exists(path):
        docker = os.environ.get("DOCKER", "docker")
        subprocess.run([docker, "kill", "--signal", signal, container], check=True, capture_output=True, timeout=30)
        return

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)

    conn = UnixConnection("localhost", timeout=10)
    conn.request("POST", f"/containers/{container}/kill?signal={signal}")
    response = conn.getresponse()
    assert response.status == 204, f"docker kill: {response.status} {response.read()!r}"
    conn.close()


# --- checks --------------------------------------------------------------------------------------------


class Checks:
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


def collect_generate_stream(client: Client, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tokens: list[dict[str, Any]] = []
    done: dict[str, Any] | None = None
    for event, data in client.stream("/v1/generate", {**body, "stream": True}):
        payload = json.loads(data)
        assert event in ("token", "done"), f"unexpected event {event}: {data}"
        assert done is None, f"event after done: {data}"
        if event == "token":
            assert payload["index"] == len(tokens), f"token index {payload['index']} != {len(tokens)}"
            tokens.append(payload)
        else:
            done = payload
    assert done is not None, "stream ended without a done event"
    return tokens, done


def collect_completion_stream(client: Client, body: dict[str, Any]) -> tuple[str, str | None]:
    text, finish, ended = "", None, False
    for _, data in client.stream("/v1/completions", {**body, "stream": True}):
        assert not ended, f"data after [DONE]: {data}"
        if data == "[DONE]":
            ended = True
            continue
        chunk = json.loads(data)
        assert chunk["object"] == "text_completion", chunk
        for choice in chunk["choices"]:
            text += choice["text"]
            finish = choice["finish_reason"] or finish
    assert ended, "stream did not end with data: [DONE]"
    return text, finish


def check_all(client: Client, exp: dict[str, Any], quick: bool) -> int:
    checks = Checks()
    assert exp["translate"] and exp["classify"], "expectations.json needs translation and classification cases"
    gen = exp["generate"]
    greedy = {"prompt": gen["prompt"], "max_new_tokens": gen["max_new_tokens"], "temperature": 0.0}

    def health() -> str:
        assert ok(client.get("/health"), "/health") == {"status": "ok"}
        assert ok(client.get("/ready"), "/ready")["status"] == "ready"
        return "health ok, ready"

    def models() -> str:
        data = ok(client.get("/v1/models"), "/v1/models")
        cards = {card["id"]: card for card in data["data"]}
        assert set(exp["models"]) <= set(cards), f"served {sorted(cards)}, expected {exp['models']}"
        for card in cards.values():
            providers = set(card["provider"].values())
            assert providers == {exp["provider"]}, f"{card['id']} runs on {providers}"
        tasks = {card["id"]: card["task"] for card in cards.values()}
        return f"{tasks}, all on {exp['provider']}"

    def one_by_one(cases: list[dict[str, Any]], path: str, key: str) -> Iterator[tuple[dict[str, Any], Any]]:
        """Each case's text in a request of its own: the case, and the one result under `key`."""
        for case in cases:
            (result,) = ok(client.post(path, {"text": case["text"]}), path)[key]
            yield case, result

    def translate() -> str:
        outputs = []
        for case, result in one_by_one(exp["translate"], "/v1/translate", "translations"):
            missing = has_words(result["text"], case["expect_words"])
            assert not missing, f"{case['text']!r} -> {result['text']!r}: missing {missing}"
            outputs.append(result["text"])
        return " | ".join(outputs)

    def translate_batch_nbest() -> str:
        texts = [case["text"] for case in exp["translate"]]
        data = ok(client.post("/v1/translate", {"text": texts, "num_beams": 4, "n_best": 2}), "/v1/translate batch")
        assert len(data["translations"]) == len(texts)
        for case, result in zip(exp["translate"], data["translations"], strict=True):
            assert not has_words(result["text"], case["expect_words"]), f"batch: {result['text']!r}"
            scores = [h["score"] for h in result["n_best"]]
            assert len(scores) == 2 and scores == sorted(scores, reverse=True), scores
            assert result["text"] == result["n_best"][0]["text"]
        greedy_data = ok(client.post("/v1/translate", {"text": texts[0], "num_beams": 1}), "/v1/translate greedy")
        return f"{len(texts)} texts, n_best 2; greedy: {greedy_data['translations'][0]['text']!r}"

    def classify() -> str:
        labels = []
        for case, result in one_by_one(exp["classify"], "/v1/classify", "results"):
            assert result["label"] == case["label"], f"{case['text']!r} -> {result['label']} ({result['scores']})"
            assert abs(sum(result["scores"].values()) - 1) < 1e-3, result["scores"]
            labels.append(f"{result['label']} {result['score']:.2f}")
        return ", ".join(labels)

    def classify_batch_pairs() -> str:
        texts = [case["text"] for case in exp["classify"]]
        pair = [texts[0], texts[-1]]
        data = ok(client.post("/v1/classify", {"text": [*texts, pair], "top_k": 2}), "/v1/classify batch")
        results = data["results"]
        assert len(results) == len(texts) + 1
        for case, result in zip(exp["classify"], results, strict=False):
            assert result["label"] == case["label"], f"batched {case['text']!r} -> {result['label']}"
        assert results[-1]["top_k"][0]["label"] == results[-1]["label"]
        return f"{len(texts)} texts + 1 pair"

    def generate() -> str:
        first = ok(client.post("/v1/generate", greedy), "/v1/generate")
        again = ok(client.post("/v1/generate", greedy), "/v1/generate")
        assert first["text"] == again["text"], "greedy decoding is not repeatable"
        assert first["finish_reason"] in ("eos", "length", "stop")
        assert 0 < first["usage"]["completion_tokens"] <= gen["max_new_tokens"], first["usage"]
        missing = has_words(first["text"], gen.get("expect_words", []))
        assert not missing, f"{gen['prompt']!r} -> {first['text']!r}: missing {missing}"
        return repr(gen["prompt"] + first["text"])

    def generate_sampling() -> str:
        body = {"prompt": gen["prompt"], "max_new_tokens": 12, "temperature": 0.8, "top_k": 40, "top_p": 0.95,
                "repetition_penalty": 1.1, "seed": 1234, "ignore_eos": True}
        a = ok(client.post("/v1/generate", body), "/v1/generate sampled")
        b = ok(client.post("/v1/generate", body), "/v1/generate sampled")
        assert a["text"] == b["text"] and a["seed"] == 1234, "the same seed gave different samples"
        assert a["usage"]["completion_tokens"] == 12 and a["finish_reason"] == "length", a
        return repr(a["text"])

    def generate_stream() -> str:
        whole = ok(client.post("/v1/generate", greedy), "/v1/generate")
        tokens, done = collect_generate_stream(client, greedy)
        streamed = "".join(t["text"] for t in tokens)
        assert done["text"] == whole["text"], f"stream {done['text']!r} != whole {whole['text']!r}"
        assert streamed == done["text"], f"token texts {streamed!r} != done text {done['text']!r}"
        assert done["usage"]["completion_tokens"] == len(tokens), (done["usage"], len(tokens))
        assert done["finish_reason"] == whole["finish_reason"]
        return f"{len(tokens)} token events + done, same text as without streaming"

    def completions() -> str:
        body = {"model": "generator", "prompt": gen["prompt"], "max_tokens": gen["max_new_tokens"], "temperature": 0}
        data = ok(client.post("/v1/completions", body), "/v1/completions")
        assert data["object"] == "text_completion" and data["model"] == "generator"
        (choice,) = data["choices"]
        whole = ok(client.post("/v1/generate", greedy), "/v1/generate")
        assert choice["text"] == whole["text"], f"completions {choice['text']!r} != generate {whole['text']!r}"
        assert data["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
        text, finish = collect_completion_stream(client, body)
        assert text == choice["text"], f"streamed {text!r} != {choice['text']!r}"
        assert finish == choice["finish_reason"], (finish, choice["finish_reason"])
        return f"finish_reason {finish}; streamed = whole = /v1/generate; ends with [DONE]"

    def errors() -> str:
        bad = client.post("/v1/translate", {"txt": "hello"})
        assert bad.status == 422, bad.status
        assert client.call("POST", "/v1/classify", raw=b"{not json").status == 400
        unknown = client.post("/v1/completions", {"model": "no-such-model", "prompt": "x"})
        assert unknown.status == 404, unknown.status
        # A budget beyond the context is clamped (SERVE_STRICT_MAX_TOKENS=false); a prompt beyond it is refused.
        too_long = client.post("/v1/generate", {"prompt": gen["prompt"] * 2000, "max_new_tokens": 8})
        assert too_long.status == 422, too_long.status
        clamped = client.post("/v1/generate", {"prompt": gen["prompt"], "max_new_tokens": 10**6})
        assert clamped.status == 200 and clamped.json()["finish_reason"] in ("length", "eos"), clamped.status
        return f"422 {error_type(bad)}, 400 bad JSON, 404 {error_type(unknown)}, 422 {error_type(too_long)}"

    def metrics() -> str:
        reply = client.get("/metrics")
        assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain"), reply.status
        for name in exp["metrics"]:
            assert re.search(rf"^{name}\b", reply.text, re.MULTILINE), f"metric {name} missing"
        served = re.search(
            r'^serve_requests_total\{endpoint="/v1/translate",status="200"\} (\S+)', reply.text, re.MULTILINE
        )
        assert served and float(served.group(1)) >= 1, "translate requests not counted"
        return f"{len(exp['metrics'])} metrics present; translate 200s: {served.group(1)}"

    def docs_and_playground() -> str:
        """Built into the image: /docs, /redoc and the playground load nothing from outside."""
        fetched = 0
        for page in ("/docs", "/redoc", "/playground"):
            reply = client.get(page)
            assert reply.status == 200, f"{page}: HTTP {reply.status}"
            pattern = r"""(?:src|href)=["']([^"']+)["']|url: ["']([^"']+)["']"""
            urls = [a or b for a, b in re.findall(pattern, reply.text)]
            external = [u for u in urls if u.startswith(("http:", "https:", "//"))]
            assert not external, f"{page} loads {external}"
            for url in (u for u in urls if u.startswith("/")):
                assert client.get(url).status == 200, f"{page}: {url} is missing"
                fetched += 1
        return f"/docs, /redoc, /playground and {fetched} assets, all local"

    def client_protocols() -> str:
        """TGI, Inference API, vLLM tokenizer and OpenAI scoring routes, as the clients call them."""
        tgi_body = {"inputs": gen["prompt"], "parameters": {"max_new_tokens": gen["max_new_tokens"]}}
        tgi = ok(client.post("/generate", tgi_body), "/generate")
        whole = ok(client.post("/v1/generate", greedy), "/v1/generate")
        assert tgi["generated_text"] == whole["text"], (tgi, whole["text"])
        body = {"model": "generator", "prompt": gen["prompt"], "max_tokens": 0, "echo": True, "logprobs": 1}
        logprobs = ok(client.post("/v1/completions", body), "/v1/completions echo")["choices"][0]["logprobs"]
        assert logprobs["token_logprobs"][0] is None and all(x < 0 for x in logprobs["token_logprobs"][1:])
        info = ok(client.get("/tokenizer_info"), "/tokenizer_info")
        eos = ok(client.post("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}), "/tokenize")
        assert eos["count"] == 1, eos
        case = exp["classify"][0]
        ranked = ok(client.post("/models/classifier", {"inputs": case["text"]}), "/models/classifier")
        assert ranked[0][0]["label"] == case["label"], ranked
        return f"TGI = /v1/generate, prompt scored ({len(logprobs['tokens'])} tokens), /tokenize, HF classification"

    def embed() -> str:
        """The packaged all-MiniLM-L6-v2 embedder (its weights from the installed package): each query's
        paraphrase is its nearest document, through OpenAI's and TEI's routes alike."""
        case = exp["embed"]
        docs, queries = case["documents"], case["queries"]
        data = ok(client.post("/v1/embeddings", {"model": "embedder", "input": docs + queries}), "/v1/embeddings")
        vectors = [item["embedding"] for item in sorted(data["data"], key=lambda item: item["index"])]
        assert all(len(v) == case["dimensions"] for v in vectors), [len(v) for v in vectors]
        doc_vectors, query_vectors = vectors[: len(docs)], vectors[len(docs) :]
        for q, (query, target) in enumerate(zip(queries, case["nearest"], strict=True)):
            sims = [sum(a * b for a, b in zip(query_vectors[q], d, strict=True)) for d in doc_vectors]
            assert max(range(len(docs)), key=sims.__getitem__) == target, (query, sims)
        tei = ok(client.post("/embed", {"inputs": queries[0]}), "/embed")
        assert max(abs(a - b) for a, b in zip(tei[0], query_vectors[0], strict=True)) < 1e-5
        return f"{len(queries)} queries find their paraphrase among {len(docs)} documents; /embed agrees"

    checks.run("health + ready", health)
    checks.run("GET /v1/models", models)
    checks.run("POST /v1/translate (expected French)", translate)
    checks.run("POST /v1/classify (expected labels)", classify)
    checks.run("POST /v1/embeddings (paraphrase retrieval)", embed)
    checks.run("POST /v1/generate stream=true", generate_stream)
    checks.run("POST /v1/completions + stream", completions)
    if not quick:
        checks.run("POST /v1/translate batch, beams, n_best", translate_batch_nbest)
        checks.run("POST /v1/classify batch + pair", classify_batch_pairs)
        checks.run("POST /v1/generate greedy", generate)
        checks.run("POST /v1/generate seeded sampling", generate_sampling)
        checks.run("error responses", errors)
        checks.run("GET /metrics", metrics)
        checks.run("offline docs and playground", docs_and_playground)
        checks.run("client protocols (TGI, HF, tokenizer, scoring)", client_protocols)
    return checks.finish()


def check_drain(client: Client, exp: dict[str, Any], container: str) -> int:
    checks = Checks()
    cfg = exp["drain"]
    body = {"prompt": cfg["prompt"], "max_new_tokens": cfg["max_new_tokens"], "ignore_eos": True,
            "temperature": 0.8, "seed": 7}
    started = threading.Barrier(cfg["streams"] + 1, timeout=60)
    results: list[Any] = [None] * cfg["streams"]

    def stream(i: int) -> None:
        tokens: list[dict[str, Any]] = []
        try:
            events = client.stream("/v1/generate", {**body, "stream": True})
            for event, data in events:
                payload = json.loads(data)
                if event == "token":
                    tokens.append(payload)
                    if len(tokens) == 1:
                        started.wait()  # every stream is in flight before the signal goes out
                else:
                    results[i] = (tokens, event, payload, time.monotonic())
        except urllib.error.HTTPError as exc:
            results[i] = AssertionError(f"HTTP {exc.code}: {exc.read()[:300]!r}")
            started.abort()
        except Exception as exc:
            results[i] = exc
            started.abort()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(cfg["streams"])]
    for t in threads:
        t.start()
    state: dict[str, Any] = {}

    def signal() -> str:
        try:
            started.wait()
        except threading.BrokenBarrierError:
            errors = [r for r in results if isinstance(r, Exception)]
            raise AssertionError(f"a stream failed before the signal: {errors[0] if errors else 'timeout'}") from None
        state["signalled"] = time.monotonic()
        docker_kill(container, "SIGTERM")
        return f"{cfg['streams']} streams in flight, SIGTERM sent"

    def draining() -> str:
        deadline = time.monotonic() + 5
        while True:  # the signal handler runs on the server's next loop tick
            ready = client.get("/ready")
            if ready.status == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert ready.status == 503 and ready.json()["status"] == "draining", (ready.status, ready.body)
        gauge = re.search(r"^serve_inflight_requests (\S+)", client.get("/metrics").text, re.MULTILINE)
        inflight = float(gauge.group(1)) if gauge else 0.0
        refused = client.post("/v1/classify", {"text": "a new request during the drain"})
        assert refused.status == 503, f"new request during drain: HTTP {refused.status}"
        assert inflight >= 1, (
            "no request in flight after SIGTERM: the generations ended before the signal; "
            "raise drain.max_new_tokens or drain.streams in expectations.json"
        )
        return f"/ready 503 draining, new request 503 {error_type(refused)}, {inflight:.0f} in flight"

    def completed() -> str:
        for t in threads:
            t.join(timeout=120)
        last = 0.0
        for i, result in enumerate(results):
            assert not isinstance(result, Exception), f"stream {i}: {result!r}"
            assert result is not None, f"stream {i} did not finish"
            tokens, event, payload, at = result
            assert event == "done", f"stream {i} ended with {event}: {payload}"
            assert payload["finish_reason"] == "length", payload
            assert len(tokens) == payload["usage"]["completion_tokens"] == cfg["max_new_tokens"], len(tokens)
            last = max(last, at)
        after = last - state["signalled"]
        return f"every stream got all {cfg['max_new_tokens']} tokens, the last {after:.2f}s after SIGTERM"

    checks.run("SIGTERM during generation", signal)
    if "signalled" in state:
        checks.run("server drains", draining)
        checks.run("in-flight generations complete", completed)
    return checks.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("check", "drain"))
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--expectations", type=Path, default=HERE / "expectations.json")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--quick", action="store_true", help="check: a subset of the endpoints")
    parser.add_argument("--container", help="drain: the id of the server's container")
    args = parser.parse_args()
    expectations = json.loads(args.expectations.read_text())
    client = Client(args.url, args.api_key)
    if args.command == "check":
        sys.exit(check_all(client, expectations, args.quick))
    if not args.container:
        parser.error("drain needs --container")
    sys.exit(check_drain(client, expectations, args.container))


if __name__ == "__main__":
    main()
