"""The translation task's registry record (service/engine/registry.py)."""

from __future__ import annotations

from contract.kinds import TRANSLATION
from service.engine.registry import TaskRecord
from service.engine.tasks.translation.service import TranslationService

TASK = TaskRecord(
    TRANSLATION,
    build=lambda a, s, settings, metrics: TranslationService(a, s["encoder"], s["decoder"], settings, metrics),
    route_module="service.api.native.translate",
    routes=("/v1/translate",),
    summary="translation (encoder-decoder: greedy, beam search with n-best, sampling, streaming): `/v1/translate`",
    request_bodies=("TranslateRequest",),
)
