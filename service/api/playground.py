"""The playground: a static page (service/playground/, no build step) that calls this server's own API:
translate, streamed generation and classification, each with an attention heat map."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

PAGE = Path(__file__).resolve().parent.parent / "playground"

router = APIRouter(include_in_schema=False)


@router.get("/playground")
async def playground() -> FileResponse:
    return FileResponse(PAGE / "index.html", media_type="text/html")


@router.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse("/playground")


def install_playground(app: FastAPI) -> None:
    app.mount("/playground/static", StaticFiles(directory=PAGE), name="playground-static")
    app.include_router(router)
