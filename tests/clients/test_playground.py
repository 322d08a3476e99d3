"""The playground page in a real headless browser (Debian's chromium driven by Playwright): type, submit,
see streamed tokens arrive, see heat maps with the dimensions of the attention the API returns, and the
embeddings tab's similarity matrix.

Set PLAYGROUND_SCREENSHOT=path to also save the screenshot docs/clients.md shows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from playwright.sync_api import Locator, Page, sync_playwright

from tests.clients.conftest import Server

CHROMIUM = Path("/usr/bin/chromium")
# A closed network: nothing in the background, no QUIC, no GPU, a fresh profile (Playwright makes one).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def page(server: Server) -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail("the playground test needs Debian's chromium: apt-get install chromium (.ci/run installs it)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{server.url}/")  # redirects to /playground
        assert page.url.endswith("/playground")
        yield page
        browser.close()
        assert not errors, errors


def attribute(locator: Locator, name: str) -> str:
    value = locator.get_attribute(name)
    assert value is not None, f"no {name} attribute"
    return value


def heatmap(page: Page, panel: str) -> tuple[int, int]:
    canvas = page.locator(f"#{panel} canvas")
    canvas.wait_for()
    rows, cols = int(attribute(canvas, "data-rows")), int(attribute(canvas, "data-cols"))
    width, height, colours = canvas.evaluate(
        """c => {
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            const seen = new Set();
            for (let i = 0; i < d.length; i += 4 * 7) seen.add(`${d[i]},${d[i + 1]},${d[i + 2]}`);
            return [c.width, c.height, seen.size];
        }"""
    )
    assert (width, height) == (cols * 18, rows * 18) and colours > 1  # drawn, and not one flat colour
    assert page.locator(f"#{panel} .row-labels span").count() == rows
    assert page.locator(f"#{panel} .col-labels span").count() == cols
    return rows, cols


def test_translate(page: Page, server: Server) -> None:
    text = "And God said, Let there be light: and there was light."
    page.fill("#translate textarea", text)
    page.select_option("#translate select[name=num_beams]", "4")
    page.click("#translate button[type=submit]")
    body = {"text": text, "num_beams": 4, "return_attention": True}
    api = httpx.post(f"{server.url}/v1/translate", json=body, timeout=60)
    t = api.json()["translations"][0]
    assert heatmap(page, "translate") == (len(t["attention"]["target_tokens"]), len(t["attention"]["source_tokens"]))
    assert page.inner_text("#translate [data-role=output]") == t["text"]
    layers, heads = len(t["attention"]["cross"]), len(t["attention"]["cross"][0])
    assert page.locator("#translate select[data-role=layer] option").count() == layers
    assert page.locator("#translate select[data-role=head] option").count() == heads + 1  # + the mean
    page.select_option("#translate select[data-role=head]", "0")
    page.select_option("#translate select[data-role=layer]", "0")
    assert heatmap(page, "translate") == (len(t["attention"]["target_tokens"]), len(t["attention"]["source_tokens"]))


def test_generate_streams_tokens(page: Page, server: Server) -> None:
    page.click("button.tab[data-tab=generate]")
    prompt = "The Congress of the United States"
    page.fill("#generate textarea", prompt)
    page.fill("#generate input[name=max_new_tokens]", "40")
    page.fill("#generate input[name=temperature]", "0")
    # Count the separate moments at which tokens appear: a stream adds them over many reads.
    page.evaluate(
        """() => {
            window.tokenArrivals = 0;
            new MutationObserver(() => { window.tokenArrivals += 1; })
                .observe(document.querySelector("#generate [data-role=output]"), {childList: true, subtree: true});
        }"""
    )
    page.click("#generate button[type=submit]")
    page.locator("#generate canvas").wait_for()
    api = httpx.post(
        f"{server.url}/v1/generate",
        json={"prompt": prompt, "max_new_tokens": 40, "temperature": 0, "return_attention": True},
        timeout=60,
    ).json()
    tokens = page.locator("#generate [data-role=generated] .token")
    assert tokens.count() == api["usage"]["completion_tokens"]
    assert "".join(tokens.all_inner_texts()) == api["text"]
    assert page.evaluate("window.tokenArrivals") > 2
    fed = len(api["attention"]["tokens"])  # prompt + output but the last token (never fed back)
    assert fed == api["usage"]["prompt_tokens"] + api["usage"]["completion_tokens"] - 1
    assert heatmap(page, "generate") == (fed, fed)


def test_classify_and_screenshot(page: Page, server: Server, tmp_path: Path) -> None:
    page.click("button.tab[data-tab=classify]")
    text = "A wonderful, moving film with brilliant performances."
    page.fill("#classify textarea", text)
    page.click("#classify button[type=submit]")
    api = httpx.post(f"{server.url}/v1/classify", json={"text": text, "return_attention": True}, timeout=60)
    result = api.json()["results"][0]
    heads = len(result["attention"]["layers"][0])
    assert heatmap(page, "classify") == (heads, len(result["attention"]["tokens"]))  # [CLS] row of each head
    assert page.inner_text("#classify [data-role=output]").startswith(result["label"])
    page.select_option("#classify select[data-role=head]", "1")
    assert heatmap(page, "classify") == (1, len(result["attention"]["tokens"]))

    page.click("button.tab[data-tab=generate]")  # the screenshot shows the streamed generation
    shot = Path(os.environ.get("PLAYGROUND_SCREENSHOT", tmp_path / "playground.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_embeddings_similarity_matrix(page: Page, server: Server) -> None:
    """The texts typed one per line come back as a matrix of their cosines, as POST /v1/embeddings' vectors
    give them: ones on the diagonal, symmetric, and the paraphrase pair above the unrelated one."""
    page.click("button.tab[data-tab=embed]")
    texts = ["A man is playing a guitar.", "Someone is playing an instrument.", "The stock market fell sharply."]
    page.fill("#embed textarea", "\n".join(texts) + "\n\n")  # blank lines are not texts
    page.click("#embed button[type=submit]")
    cells = page.locator("#embed table.similarity tbody td")
    cells.first.wait_for()
    assert cells.count() == len(texts) ** 2
    shown = [[float(attribute(cells.nth(r * len(texts) + c), "data-value")) for c in range(len(texts))]
             for r in range(len(texts))]
    data = httpx.post(f"{server.url}/v1/embeddings", json={"input": texts}, timeout=60).json()["data"]
    vectors = [np.asarray(d["embedding"]) for d in sorted(data, key=lambda d: d["index"])]
    expected = [[float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for b in vectors] for a in vectors]
    np.testing.assert_allclose(shown, expected, atol=1e-6)
    assert shown[0][1] > shown[0][2]  # the paraphrases are closer than the unrelated sentence
    assert cells.first.inner_text() == "1.00"
    colours = {cells.nth(i).evaluate("c => getComputedStyle(c).backgroundColor") for i in range(cells.count())}
    assert len(colours) > 1  # coloured by value, under the page's Content-Security-Policy
    row_labels = page.locator("#embed table.similarity tbody th").all_inner_texts()
    assert row_labels == [f"{i + 1}. {t}" for i, t in enumerate(texts)]
    summary = page.inner_text("#embed [data-role=output]")
    assert summary.startswith(f"{len(texts)} vectors of {len(vectors[0])} dimensions")


def test_api_docs_render_offline(page: Page, server: Server) -> None:
    """Swagger UI and ReDoc draw the API from local assets only (the browser has no other network here,
    and any request leaving the server would be seen below)."""
    outside: list[str] = []
    blocked: list[str] = []  # by the pages' Content-Security-Policy, before anything leaves the browser
    local = (server.url, f"blob:{server.url}", "data:")
    page.on("request", lambda r: None if r.url.startswith(local) else outside.append(r.url))
    page.on("requestfailed", lambda r: blocked.append(r.url) if "csp" in (r.failure or "").lower() else None)
    page.goto(f"{server.url}/docs")
    page.locator(".swagger-ui .opblock").first.wait_for(timeout=30_000)
    assert page.locator(".swagger-ui .opblock").count() > 10
    assert page.get_by_text("/v1/completions").first.is_visible()
    page.goto(f"{server.url}/redoc")
    page.get_by_text("/v1/completions").first.wait_for(timeout=30_000)
    page.wait_for_timeout(500)  # failure events arrive after the request events
    assert not set(outside) - set(blocked), (outside, blocked)
    page.goto(f"{server.url}/playground")


def test_docs_examples_succeed_when_executed(page: Page, server: Server) -> None:
    """Every operation in /docs, run with "Try it out" exactly as the page pre-fills it (the body example,
    the path parameters' examples), answers 2xx. It used to pre-fill `"model": "string"` (a 404),
    `logit_bias: {"additionalProp1": 0}` (a 422), a seed maximum that JavaScript rounds above the bound
    (a 422), and nothing at all for POST / and POST /models/{name}. Under the page's Content-Security-Policy."""
    operations = sum(len(item) for item in httpx.get(f"{server.url}/openapi.json").json()["paths"].values())
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(f"{server.url}/docs")
    blocks = page.locator(".swagger-ui .opblock")
    blocks.first.wait_for(timeout=30_000)
    statuses: dict[str, str] = {}
    for i in range(blocks.count()):
        block = blocks.nth(i)
        method = block.locator(".opblock-summary-method").inner_text()
        name = f"{method} {block.locator('.opblock-summary-path').get_attribute('data-path')}"
        block.locator(".opblock-summary").click()
        block.locator("button.try-out__btn").click()
        block.locator("button.execute").click()
        # The answer's status, or a required field that the page left empty (it then sends nothing)
        answer = block.locator(".live-responses-table tbody .response-col_status, .invalid").first
        answer.wait_for(timeout=120_000)
        empty = "invalid" in (answer.get_attribute("class") or "").split()
        # "200", or "200 Undocumented" (GET /: the browser follows the documented 307 to the playground)
        statuses[name] = "not sent: a required field is empty" if empty else answer.inner_text().split()[0]
        block.locator(".opblock-summary").click()  # fold it again
    assert len(statuses) == operations, statuses
    assert {name: s for name, s in statuses.items() if not s.startswith("2")} == {}, statuses
    assert not blocked, blocked
    page.goto(f"{server.url}/playground")
