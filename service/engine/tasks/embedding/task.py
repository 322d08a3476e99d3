"""The embedding task's registry record (service/engine/registry.py)."""

from __future__ import annotations

from contract.kinds import EMBEDDING
from service.engine.registry import TaskRecord
from service.engine.tasks.embedding.service import EmbeddingService

TASK = TaskRecord(
    EMBEDDING,
    build=lambda a, s, settings, metrics: EmbeddingService(a, s["encoder"], settings, metrics),
    route_module="service.api.openai.embeddings",
    routes=("/v1/embeddings", "/embed"),
    summary="sentence embeddings (encoder, pooled): OpenAI's `/v1/embeddings`, TEI's `/embed`",
    request_bodies=("EmbeddingRequest",),
    inference_tasks=("sentence-similarity",),
)
