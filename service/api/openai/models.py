"""GET /v1/models and /v1/models/{id}: what is served (OpenAI list shape, plus task, what it is for, dims, provider,
quantization, card metrics)."""

from __future__ import annotations

from fastapi import APIRouter

from contract.cards import no_use_summary, use_summary
from service.api.deps import EngineDep
from service.api.errors import ApiError
from service.api.native.schemas import ModelCard, ModelList
from service.engine.engine import Engine, ModelInfo

router = APIRouter(tags=["models"])


def summary(info: ModelInfo) -> str:
    """What the model's card says it is for, on one line (or that it says nothing)."""
    return use_summary(info.artifact.card) or no_use_summary(info.artifact.task)


def _card(info: ModelInfo, details: bool, default: bool) -> ModelCard:
    """`details`: SERVE_MODEL_DETAILS; false leaves out the model card (training command, library versions)."""
    a = info.artifact
    metrics = a.card.get("metrics", {})
    return ModelCard(
        id=info.name,
        created=int(info.loaded_at),
        task=a.task,
        summary=summary(info),
        default=default,
        architecture=a.architecture,
        dims=a.dims,
        vocab_size=a.vocab_size,
        max_positions=a.max_positions,
        labels=list(a.labels) or None,
        provider={role: s.provider for role, s in info.sessions.items()},
        quantization={role: s.quantization for role, s in info.sessions.items()},
        metrics=metrics if isinstance(metrics, dict) else {},
        card=a.card if details else None,
    )


def _is_default(engine: Engine, info: ModelInfo) -> bool:
    return engine.model_names(info.artifact.task)[:1] == [info.name]


@router.get("/v1/models", response_model=ModelList, response_model_exclude_none=True)
async def list_models(engine: EngineDep) -> ModelList:
    return ModelList(
        data=[_card(info, engine.settings.model_details, _is_default(engine, info)) for info in engine.models.values()]
    )


@router.get("/v1/models/{model_id}", response_model=ModelCard, response_model_exclude_none=True)
async def retrieve_model(model_id: str, engine: EngineDep) -> ModelCard:
    """One model, as OpenAI's `models.retrieve`; 404 `model_not_found` for a model not served here."""
    info = engine.models.get(model_id)
    if info is None:
        served = ", ".join(repr(n) for n in engine.models)
        raise ApiError(404, "model_not_found", f"model {model_id!r} is not served here; served: {served}", "model")
    return _card(info, engine.settings.model_details, _is_default(engine, info))
