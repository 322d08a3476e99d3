"""The playground: a static page (service/playground/, no build step) that calls this server's own API:
translate, streamed generation and classification, each with an attention heat map."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from service.api.routes import add_routes

PAGE = Path(__file__).resolve().parents[2] / "playground"

router = APIRouter(tags=["playground"])
# Its own script, styles and API only (no inline code); the favicon is a data: URL.
CSP = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# GET / is in the OpenAPI document (POST / is the Inference API's route, so probes try GET on it too).
HOME_DOC: dict[int | str, dict[str, Any]] = {
    307: {
        "description": "Redirect to the playground page",
        "headers": {"location": {"description": "/playground", "schema": {"type": "string"}}},
    }
}


@router.get("/playground", include_in_schema=False)
async def playground() -> FileResponse:
    return FileResponse(PAGE / "index.html", media_type="text/html", headers={"Content-Security-Policy": CSP})


@router.get(
    "/", summary="Redirect to the playground", status_code=307, response_class=RedirectResponse, responses=HOME_DOC
)
async def home() -> RedirectResponse:
    return RedirectResponse("/playground")


def install_playground(app: FastAPI) -> None:
    app.mount("/playground/static", StaticFiles(directory=PAGE), name="playground-static")
    add_routes(app, router)
