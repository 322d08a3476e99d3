"""The playground's heat-map colours, in headless Chromium on the page's own files (no server): a map
whose rows put most of their weight on the first token, as trained models' do, still shows where each
row looks among the other tokens instead of drawing them near black."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, Route, sync_playwright

from tests.clients.test_playground import ARGS, CHROMIUM

PLAYGROUND = Path(__file__).resolve().parents[2] / "service" / "playground"
ORIGIN = "http://playground.test"
N = 10  # tokens


def _serve(route: Route) -> None:
    name = route.request.url.rsplit("/", 1)[-1]
    route.fulfill(path=str(PLAYGROUND / (name if name.endswith((".js", ".css")) else "index.html")))


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail("the playground test needs Debian's chromium: apt-get install chromium (.ci/run installs it)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = browser.new_page()
        page.route(f"{ORIGIN}/**", _serve)
        page.goto(f"{ORIGIN}/playground")
        yield page
        browser.close()


def _sink_map() -> list[list[float]]:
    """Causal self-attention: row r sees tokens 0..r, gives 0.8 to the first and the rest to the others,
    more to the nearer ones."""
    rows = [[1.0] + [0.0] * (N - 1)]
    for r in range(1, N):
        share = [float(c) for c in range(1, r + 1)]
        rows.append([0.8] + [0.2 * s / sum(share) for s in share] + [0.0] * (N - 1 - r))
    return rows


def _greens(page: Page, values: list[list[float]]) -> list[list[int]]:
    """Draw ``values`` with the playground's heat map and read each cell's green channel (viridis: it grows
    from 1 at no attention to 231 at the most)."""
    greens: list[list[int]] = page.evaluate(
        """values => {
            const container = document.querySelector('[data-role="heatmap"]');
            const tokens = values[0].map((_, i) => `t${i}`);
            drawHeatmap(container, {layers: 1, headChoices: [["0", "1 of 1"]],
                                    matrix: () => ({rows: tokens, cols: tokens, values})});
            const canvas = container.querySelector("canvas");
            const cell = canvas.width / tokens.length;
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            return values.map((row, r) => row.map((_, c) => {
                const x = Math.floor((c + 0.5) * cell), y = Math.floor((r + 0.5) * cell);
                return data[4 * (y * canvas.width + x) + 1];
            }));
        }""",
        values,
    )
    return greens


def test_the_first_tokens_weight_does_not_darken_the_rest(page: Page) -> None:
    greens = _greens(page, _sink_map())
    others = [greens[r][c] for r in range(1, N) for c in range(1, r + 1)]
    assert statistics.median(others) > 100, greens  # one scale for the map drew them all below 20
    for r in range(1, N):
        assert max(greens[r][1 : r + 1]) > 220 and greens[r][0] > 220, greens[r]  # each row's strongest, and the sink
        assert greens[r][r + 1 :] == [greens[0][1]] * (N - 1 - r)  # no attention: the darkest colour
