"""Operations niceties: request ids, TGI-style timing headers, CORS, SSE keep-alive comments, offline
API docs, vLLM-style metrics with a model label, process metrics, JSON logs."""

import json
import logging
import re
from pathlib import Path

from service.api.openai.common import FINISH as OPENAI_FINISH
from service.api.tgi.schemas import FINISH as TGI_FINISH
from service.engine.metrics import finished_reason
from service.logs import JsonFormatter, RequestIdFilter
from service.request_context import REQUEST_ID


async def test_request_id_is_echoed_or_made(served) -> None:
    r = await served.client.post("/v1/classify", json={"text": "hi"}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    made = await served.client.get("/health")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    odd = await served.client.get("/health", headers={"x-request-id": "no spaces or\tcontrol"})
    assert odd.headers["x-request-id"] != "no spaces or\tcontrol"  # not a sane token: replaced
    error = await served.client.post("/v1/classify", json={"text": ""}, headers={"x-request-id": "e-1"})
    assert error.status_code == 422 and error.headers["x-request-id"] == "e-1"


async def test_timing_headers(serving, slow_down) -> None:
    async with serving() as s:
        slow_down(s.engine.classifier.model.session, 0.05)
        r = await s.client.post("/v1/classify", json={"text": "hi"})
        queue, inference, total = (int(r.headers[f"x-{k}-time"]) for k in ("queue", "inference", "total"))
        assert inference >= 50 and total >= queue + inference - 1  # ms, rounded
        stream = await s.client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2, "stream": True})
        assert {"x-queue-time", "x-inference-time", "x-total-time"} <= set(stream.headers)
        health = await s.client.get("/health")
        assert "x-total-time" in health.headers and "x-queue-time" not in health.headers  # no model work


async def test_cors_is_off_by_default_and_preflight_works_when_on(serving) -> None:
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
    async with serving() as s:
        r = await s.client.post("/v1/classify", json={"text": "hi"}, headers={"Origin": "http://localhost:3000"})
        assert "access-control-allow-origin" not in r.headers
        assert (await s.client.options("/v1/generate", headers=preflight)).status_code == 405
    async with serving(cors_origins=["http://localhost:3000"], api_key="k") as s:
        headers = {**preflight, "Access-Control-Request-Headers": "authorization,content-type"}
        for path in ("/v1/generate", "/v1/completions", "/generate_stream"):  # the streaming routes
            r = await s.client.options(path, headers=headers)
            assert r.status_code == 200, (path, r.text)  # answered before the API key is asked for
            assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        ok = await s.client.post(
            "/v1/classify", json={"text": "hi"},
            headers={"Origin": "http://localhost:3000", "Authorization": "Bearer k"},
        )
        assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "x-request-id" in ok.headers["access-control-expose-headers"]
        other = await s.client.options("/v1/generate", headers={**preflight, "Origin": "http://evil.example"})
        assert other.status_code == 400


async def test_idle_streams_get_keepalive_comments(serving, slow_down) -> None:
    async with serving(sse_keepalive_s=0.05) as s:
        slow_down(s.engine.generator.model.session, 0.2)
        r = await s.client.post(
            "/v1/generate", json={"prompt": "hi", "max_new_tokens": 3, "stream": True, "ignore_eos": True}
        )
        text = r.text
        assert ": keep-alive\n\n" in text
        events = [line for line in text.split("\n") if line.startswith("event: ")]
        assert events == ["event: token"] * 3 + ["event: done"]  # the comments change nothing else
        completions = await s.client.post(
            "/v1/completions",
            json={"model": "generator", "prompt": "hi", "max_tokens": 3, "stream": True, "ignore_eos": True},
        )
        assert ": keep-alive\n\n" in completions.text and completions.text.rstrip().endswith("data: [DONE]")


async def test_docs_work_offline(served) -> None:
    for page in ("/docs", "/redoc"):
        html = (await served.client.get(page)).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ["']([^"']+)["']""", html)
        urls = [a or b for a, b in urls]
        assert urls and not [u for u in urls if u.startswith(("http:", "https:", "//"))], (page, urls)
        assert "fonts.googleapis" not in html
        for url in urls:
            r = await served.client.get(url)
            assert r.status_code == 200 and len(r.content) > 100, url
    js = await served.client.get("/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in js.headers["content-type"] and len(js.content) > 500_000


async def test_playground_is_served(served) -> None:
    assert (await served.client.get("/")).headers["location"] == "/playground"
    page = await served.client.get("/playground")
    assert page.status_code == 200 and "playground.js" in page.text
    assert (await served.client.get("/playground/static/playground.js")).status_code == 200


async def test_vllm_style_metrics(served) -> None:
    c = served.client
    await c.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 3, "ignore_eos": True})
    await c.post("/v1/classify", json={"text": "hi"})
    text = (await c.get("/metrics")).text
    prompt_tokens = len(served.engine.generator.tokenizer.encode("hi").ids)
    for needle in [
        f'serve_prompt_tokens_total{{model="generator"}} {float(prompt_tokens)}',
        'serve_request_success_total{finished_reason="length",model="generator"} 1.0',
        'serve_e2e_request_latency_seconds_count{model="generator"} 1.0',
        'serve_e2e_request_latency_seconds_count{model="classifier"} 1.0',
        'serve_request_prefill_time_seconds_count{model="generator"} 1.0',
        'serve_request_decode_time_seconds_count{model="generator"} 1.0',
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "python_gc_objects_collected_total",
    ]:
        assert needle in text, needle


def finish_reasons_table() -> list[list[str]]:
    """docs/api.md's finish reasons, one row per cause: [cause, native, OpenAI, TGI, /metrics]."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    table = doc.split("Each protocol says why a generation ended in its own words:", 1)[1].split("\n\n")[1]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return rows


async def test_each_protocol_names_finish_reasons_in_its_own_words(served) -> None:
    """The table of docs/api.md is what each protocol maps the engine's reasons to; /metrics counts in vLLM's
    words (it counted "eos" and "stop" apart under vLLM's label name)."""
    rows = finish_reasons_table()
    assert sorted(row[1] for row in rows) == ["eos", "error", "length", "stop"]
    for _, native, openai, tgi, metric in rows:
        assert (OPENAI_FINISH[native], TGI_FINISH[native], finished_reason(native)) == (openai, tgi, metric)
    eos = served.engine.generator.artifact.special_tokens["eos"]
    ended = {"model": "generator", "prompt": "hi", "max_tokens": 3, "logit_bias": {str(eos): 100}}
    r = await served.client.post("/v1/completions", json=ended)
    assert r.json()["choices"][0]["finish_reason"] == "stop", r.text
    text = (await served.client.get("/metrics")).text
    assert 'serve_request_success_total{finished_reason="stop",model="generator"} 1.0' in text
    assert 'finished_reason="eos"' not in text


def test_json_log_lines_carry_the_request_id() -> None:
    record = logging.LogRecord("service.x", logging.WARNING, __file__, 1, "queue %s", ("full",), None)
    token = REQUEST_ID.set("req-7")
    try:
        RequestIdFilter().filter(record)
    finally:
        REQUEST_ID.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "queue full" and line["level"] == "warning" and line["request_id"] == "req-7"
    assert line["logger"] == "service.x" and line["time"].endswith("+00:00")


async def test_hf_routes_are_inference_routes(served) -> None:
    await served.client.post("/models/classifier", json={"inputs": "hi"})
    text = (await served.client.get("/metrics")).text
    assert 'serve_requests_total{endpoint="/models/{name}",status="200"} 1.0' in text
    served.engine.draining = True
    for path in ("/generate", "/generate_stream", "/", "/models/classifier"):
        r = await served.client.post(path, json={"inputs": "hi"})
        assert r.status_code == 503, path
    assert (await served.client.get("/playground")).status_code == 200  # the page is not inference
