"""GET /v1/models: what is served (OpenAI list shape, plus task, dims, provider, quantization, card metrics)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import EngineDep
from service.api.schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, response_model_exclude_none=True)
async def list_models(engine: EngineDep) -> ModelList:
    cards = []
    for info in engine.models.values():
        a = info.artifact
        metrics = a.card.get("metrics", {})
        cards.append(
            ModelCard(
                id=info.name,
                created=int(info.loaded_at),
                task=a.task,
                architecture=a.architecture,
                dims=a.dims,
                vocab_size=a.vocab_size,
                max_positions=a.max_positions,
                labels=list(a.labels) or None,
                provider={role: s.provider for role, s in info.sessions.items()},
                quantization={role: s.quantization for role, s in info.sessions.items()},
                metrics=metrics if isinstance(metrics, dict) else {},
                card=a.card if engine.settings.model_details else None,  # SERVE_MODEL_DETAILS
            )
        )
    return ModelList(data=cards)
