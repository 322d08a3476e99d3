"""The generation task's registry record (service/engine/registry.py)."""

from __future__ import annotations

from contract.kinds import GENERATION
from service.engine.registry import TaskRecord
from service.engine.tasks.generation.service import GenerationService

TASK = TaskRecord(
    GENERATION,
    build=lambda a, s, settings, metrics: GenerationService(a, s["decoder"], settings, metrics),
    route_module="service.api.native.generate",
    routes=("/v1/generate", "/v1/completions", "/generate", "/generate_stream"),
    summary="text generation (decoder-only: continuous batching, streaming): `/v1/generate`, OpenAI's "
    "`/v1/completions` and, for a model with a chat template, `/v1/chat/completions`; TGI's `/generate`",
    request_bodies=("GenerateRequest", "CompletionRequest"),
)
