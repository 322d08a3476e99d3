"""GET /metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import EngineDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(engine: EngineDep) -> Response:
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)
