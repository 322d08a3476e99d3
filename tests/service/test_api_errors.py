"""Bad input never gets a 500; every error has the same JSON shape."""

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service.engine import attention

ENDPOINTS = ["/v1/translate", "/v1/generate", "/v1/completions", "/v1/classify"]


def read_api_doc() -> str:
    """The text of docs/api.md."""
    return (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def assert_error(r: Any, status: int, type_: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    if r.request.url.path.startswith(("/v1/completions", "/v1/models")):  # OpenAI's shape there: read it as ours
        assert set(error) == {"message", "type", "param", "code"}, error
        error = {"type": error["code"], "message": error["message"], "field": error["param"] or "body"}
    assert set(error) >= {"type", "message", "field"} and error["message"]
    if type_:
        assert error["type"] == type_
    return error


JUNK = [
    b"[]",
    b"null",
    b"42",
    b'"text"',
    b"{}",
    b'{"text": null, "prompt": null}',
    b'{"text": {"a": 1}, "prompt": {"a": 1}}',
    b'{"text": [1, 2], "prompt": [[1]], "model": 3}',
    "\ufffd\U0001f642".encode(),
    b'{"text": "\\ud800", "prompt": "\\udfff", "model": "generator"}',  # a lone surrogate
    b'{"text": "hi", "prompt": "hi", "temperature": NaN, "top_k": 1e30}',
]


async def test_invalid_json_is_400(served) -> None:
    for path in ENDPOINTS:
        r = await served.client.post(path, content=b'{"text": ', headers={"content-type": "application/json"})
        assert assert_error(r, 400, "invalid_json")["field"] == "body", path


async def test_junk_is_4xx_never_500(served) -> None:
    for path in ENDPOINTS:
        for payload in JUNK:
            r = await served.client.post(path, content=payload, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (path, payload, r.text)
            assert_error(r, r.status_code)


async def test_unknown_field_is_named(served) -> None:
    r = await served.client.post("/v1/classify", json={"text": "hi", "colour": "blue"})
    assert assert_error(r, 422, "validation_error")["field"] == "colour"


async def test_body_size_limit(serving) -> None:
    async with serving(max_body_bytes=2048) as s:
        big = json.dumps({"text": "x" * 5000}).encode()
        assert_error(
            await s.client.post("/v1/classify", content=big, headers={"content-type": "application/json"}), 413
        )

        async def chunked() -> AsyncIterator[bytes]:  # no content-length: counted as it arrives
            for i in range(0, len(big), 512):
                yield big[i : i + 512]

        r = await s.client.post("/v1/classify", content=chunked(), headers={"content-type": "application/json"})
        assert_error(r, 413, "payload_too_large")


async def test_api_key(serving) -> None:
    async with serving(api_key="s3cret") as s:
        r = await s.client.post("/v1/classify", json={"text": "hi"})
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        bad = await s.client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert_error(bad, 401)
        ok = await s.client.post("/v1/classify", json={"text": "hi"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert (await s.client.get("/health")).status_code == 200  # probes stay open


async def test_unknown_route_and_method(served) -> None:
    assert_error(await served.client.get("/v1/nope"), 404, "not_found")
    assert_error(await served.client.get("/v1/classify"), 405, "method_not_allowed")


async def test_model_not_loaded(serving) -> None:
    """404 everywhere, as docs/api.md and the OpenAPI description say: not 503, which clients retry."""
    async with serving(models="classifier") as s:
        assert_error(await s.client.post("/v1/generate", json={"prompt": "hi"}), 404, "model_not_loaded")
        assert_error(await s.client.post("/v1/translate", json={"text": "hi"}), 404, "model_not_loaded")
        wrong_task = await s.client.post("/v1/classify", json={"text": "hi", "model": "generator"})
        assert assert_error(wrong_task, 404, "model_not_loaded")["field"] == "model"
        r = await s.client.post("/v1/completions", json={"model": "generator", "prompt": "hi"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert [m["id"] for m in (await s.client.get("/v1/models")).json()["data"]] == ["classifier"]
    api_doc = read_api_doc()
    for text in (api_doc, s.app.description):
        assert "404 a model that is not served here" in text or "404 model not served here" in text
        assert "not loaded, 504" not in text and "503 draining or not loaded" not in text


def test_openapi_documents_every_endpoint(served) -> None:
    paths = served.app.openapi()["paths"]
    for path in [*ENDPOINTS, "/v1/models", "/health", "/ready", "/metrics"]:
        assert path in paths
    assert "429" in paths["/v1/generate"]["post"]["responses"]


def test_the_body_timeout_status_is_documented(served) -> None:
    """SERVE_BODY_TIMEOUT_S answers 408 request_timeout in the error shape: a status of the API like the others."""
    paths = served.app.openapi()["paths"]
    for path in ENDPOINTS:
        answer = paths[path]["post"]["responses"]["408"]
        assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse"), path
    api_doc = read_api_doc()
    statuses = " ".join(api_doc.split("\n\n", 2)[1].split())  # the page's first paragraph: its error statuses
    assert "408 a body that did not arrive within `SERVE_BODY_TIMEOUT_S`" in statuses
    assert "408 body not received in time" in served.app.description


async def test_attention_maps_have_a_size_limit(served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "MAX_TOKENS", 16)  # the tiny models' contexts are below the real limit
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/v1/generate", {"prompt": "word " * 10, "max_new_tokens": 10}),
        ("/v1/classify", {"text": "word " * 20}),
        ("/v1/translate", {"text": "word " * 10, "max_new_tokens": 10}),
    ]
    for path, body in cases:
        r = await served.client.post(path, json={**body, "return_attention": True})
        assert r.status_code == 422, (path, r.text)
        assert r.json()["error"]["field"] == "return_attention"
