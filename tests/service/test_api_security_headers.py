"""Every response says nosniff and no framing; the pages carry a Content-Security-Policy that lets them
work (tests/clients/test_playground.py runs them in a browser under it), everything else one that allows
nothing."""

from __future__ import annotations

import httpx
import pytest

from service.api.asgi.security_headers import DATA_CSP

PAGES = ("/docs", "/redoc", "/playground")


def assert_guarded(response: httpx.Response) -> str:
    headers = response.headers
    assert headers["x-content-type-options"] == "nosniff", response.request.url
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    (policy,) = headers.get_list("content-security-policy")
    assert "frame-ancestors 'none'" in policy
    return policy


async def test_every_kind_of_response_is_guarded(served) -> None:
    client = served.client
    answers = [
        await client.get("/health"),
        await client.get("/openapi.json"),
        await client.post("/v1/classify", json={"text": "good"}),
        await client.post("/v1/classify", json={"text": ""}),  # 422
        await client.post("/v1/classify", content=b"{", headers={"content-type": "application/json"}),  # 400
        await client.get("/nowhere"),  # 404
        await client.put("/v1/classify"),  # 405
        await client.get("/"),  # 307
        await client.get("/docs/assets/swagger-ui.css"),
        await client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2, "stream": True}),
    ]
    for response in answers:
        assert assert_guarded(response) == DATA_CSP, response.request.url


@pytest.mark.parametrize("page", PAGES)
async def test_pages_have_their_own_policy(served, page: str) -> None:
    response = await served.client.get(page)
    assert response.status_code == 200
    policy = assert_guarded(response)
    assert "default-src 'self'" in policy and "object-src 'none'" in policy


async def test_refusals_before_the_app_are_guarded(serving) -> None:
    """The API key's 401 and the body limit's 413 come from middleware: the headers are added outside it."""
    async with serving(api_key="s3cret", max_body_bytes=2048) as s:
        assert assert_guarded(await s.client.get("/v1/models")) == DATA_CSP
        key = {"Authorization": "Bearer s3cret"}
        too_big = await s.client.post("/v1/classify", json={"text": "x" * 4000}, headers=key)
        assert too_big.status_code == 413 and assert_guarded(too_big) == DATA_CSP
