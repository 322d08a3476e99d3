"""Liveness (/health) and readiness (/ready: 503 until warm-up is done, and again while draining)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import EngineDep
from service.api.native.schemas import Status

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Status, responses={503: {"model": Status}})
async def health(engine: EngineDep) -> JSONResponse:
    if engine.failure is not None:
        return JSONResponse({"status": "failed", "detail": engine.failure}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", response_model=Status, responses={503: {"model": Status}})
async def ready(engine: EngineDep) -> JSONResponse:
    if engine.failure is not None:
        return JSONResponse({"status": "failed", "detail": engine.failure}, status_code=503)
    if engine.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not engine.ready:
        return JSONResponse({"status": "warming_up"}, status_code=503)
    return JSONResponse({"status": "ready"})
