"""/docs (Swagger UI) and /redoc that work offline: their scripts, styles and favicon are served from
the `fastapi-offline` package's copies (installed with the server, so also in the image); no CDN, no
web fonts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs/assets"  # under /docs, so SERVE_PUBLIC_DOCS opens it together with the pages
# Only this server: ReDoc's footer links a logo on its CDN, which the browser then never asks for.
# (The pages' own scripts are inline; ReDoc runs its search in a blob: worker.)
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; worker-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


# Each page: its renderer (ReDoc without its Google Fonts), the title's suffix, and which local asset
# file each of the renderer's URL arguments names (the defaults point at CDNs).
PAGES: dict[str, tuple[Callable[..., HTMLResponse], str, dict[str, str]]] = {
    "/docs": (
        get_swagger_ui_html,
        "Swagger UI",
        {
            "swagger_js_url": "swagger-ui-bundle.js",
            "swagger_css_url": "swagger-ui.css",
            "swagger_favicon_url": "favicon.png",
        },
    ),
    "/redoc": (
        partial(get_redoc_html, with_google_fonts=False),
        "ReDoc",
        {
            "redoc_js_url": "redoc.standalone.js",
            "redoc_favicon_url": "favicon.png",
        },
    ),
}


def install_docs(app: FastAPI) -> None:
    """Call on an app created with docs_url=None and redoc_url=None."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS), name="docs-assets")
    for path, (render, title, assets) in PAGES.items():
        endpoint = _page(app, render, title, assets)
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False, name=path.strip("/"))


def _page(
    app: FastAPI, render: Callable[..., HTMLResponse], title: str, assets: dict[str, str]
) -> Callable[[Request], Awaitable[HTMLResponse]]:
    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")  # behind a proxy's path prefix, every URL carries it
        urls = {arg: f"{root}{ASSETS_URL}/{file}" for arg, file in assets.items()}
        html = render(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - {title}", **urls)
        html.headers["Content-Security-Policy"] = CSP
        return html

    return page
