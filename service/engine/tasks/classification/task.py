"""The classification task's registry record (service/engine/registry.py)."""

from __future__ import annotations

from contract.kinds import CLASSIFICATION
from service.engine.registry import TaskRecord
from service.engine.tasks.classification.service import ClassificationService

TASK = TaskRecord(
    CLASSIFICATION,
    build=lambda a, s, settings, metrics: ClassificationService(a, s["encoder"], settings, metrics),
    route_module="service.api.native.classify",
    routes=("/v1/classify",),
    summary="classification (encoder: dynamic batching, sentence pairs): `/v1/classify`; a one-label "
    "cross-encoder also reranks (`/rerank`)",
    request_bodies=("ClassifyRequest",),
)
