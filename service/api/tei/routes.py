"""Hugging Face Text Embeddings Inference (TEI): `POST /embed` and `POST /rerank` in TEI's request and
response shapes, TEI's error body `{"error": message, "error_type": kind}` on those paths, and the fields
TEI's `/info` adds to TGI's (service/api/hf/routes.py serves /info)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from contract.kinds import CLASSIFICATION, EMBEDDING
from service.api.asgi.error_rewrite import ErrorShapeMiddleware
from service.api.asgi.lean_route import LeanRoute
from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import ApiError
from service.api.native.schemas import (
    MAX_EMBEDDING_INPUTS,
    AnyCaseTruncationSide,
    Dimensions,
    EmbeddingInputs,
    Lenient,
    Text,
    bounded,
    truncation_side,
)
from service.engine.capabilities import Capabilities
from service.engine.engine import Engine
from service.engine.tasks.classification.service import ClassificationJob
from service.engine.tasks.embedding.service import EmbeddingJob, EmbedInput

router = APIRouter(tags=["text embeddings inference"], route_class=LeanRoute)

TEI_PATHS = ("/embed", "/rerank")
MAX_CLIENT_BATCH_SIZE = MAX_EMBEDDING_INPUTS  # inputs (or texts) in one request; TEI's flag of the same name, raised


class EmbedRequest(Lenient):
    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": ["What is Deep Learning?", "Hello"]}]})

    inputs: EmbeddingInputs = Field(description="a text, a list of texts, token ids, or a list of token-id lists")
    normalize: bool = True
    truncate: bool = Field(False, description="cut an input past the model's limit instead of a 422")
    truncation_direction: AnyCaseTruncationSide = "right"
    prompt_name: None = Field(None, description="not supported: this server's models have no prompts (must be null)")
    dimensions: Dimensions = None


class RerankRequest(Lenient):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"query": "What is Deep Learning?", "texts": ["Deep Learning is...", "Hi"]}]}
    )

    query: Text
    texts: Annotated[list[Text], bounded(MAX_CLIENT_BATCH_SIZE)]
    truncate: bool = Field(False, description="cut a (query, text) pair past the model's limit instead of a 422")
    truncation_direction: AnyCaseTruncationSide = "right"
    raw_scores: bool = Field(False, description="the model's logit instead of its sigmoid")
    return_text: bool = False


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


def embed_inputs(inputs: str | list[Any]) -> tuple[list[EmbedInput], list[str]]:
    """TEI's `inputs` as engine inputs, and the field of each: one text or id list is `inputs`."""
    if isinstance(inputs, str) or all(isinstance(x, int) for x in inputs):
        return [inputs], ["inputs"]
    return list(inputs), [f"inputs[{i}]" for i in range(len(inputs))]


@router.post("/embed", summary="TEI: embed texts (always a list of vectors)")
async def embed(body: EmbedRequest, engine: EngineDep, request: Request) -> list[list[float]]:
    inputs, fields = embed_inputs(body.inputs)
    job = EmbeddingJob(
        inputs,
        fields,
        normalize=body.normalize,
        truncate=body.truncate,
        truncation_direction=truncation_side(body.truncation_direction),
        dimensions=body.dimensions,
    )
    handle = await engine.submit(job)
    return [e.vector for e in await unless_disconnected(request, handle.results())]


def reranker_or_none(engine: Engine) -> Capabilities | None:
    """The first served one-label classification model: a cross-encoder, whose logit is a relevance score."""
    return next((m for m in engine.served().values() if m.task == CLASSIFICATION.name and m.reranks), None)


def reranker(engine: Engine) -> Capabilities:
    found = reranker_or_none(engine)
    if found is not None:
        return found
    classifiers = [m for m in engine.served().values() if m.task == CLASSIFICATION.name]
    served = ", ".join(f"{m.name!r} ({len(m.labels)} labels)" for m in classifiers) or "none"
    raise ApiError(
        404, "model_not_loaded", f"no reranker (a classification model with one label) is served; classifiers: {served}"
    )


@router.post("/rerank", response_model=list[Rank], response_model_exclude_none=True,
             summary="TEI: rank texts by relevance to a query, best first (a cross-encoder)")  # fmt: skip
async def rerank(body: RerankRequest, engine: EngineDep, request: Request) -> list[Rank]:
    model = reranker(engine)
    job = ClassificationJob(
        [(body.query, text) for text in body.texts],
        [f"texts[{i}]" for i in range(len(body.texts))],
        truncate=body.truncate,
        truncation_direction=truncation_side(body.truncation_direction),
        model=model.name,
    )
    handle = await engine.submit(job)
    results = await unless_disconnected(request, handle.results())
    ranks = [
        Rank(index=i, score=r.logits[0] if body.raw_scores else r.score, text=text if body.return_text else None)
        for i, (r, text) in enumerate(zip(results, body.texts, strict=True))
    ]
    return sorted(ranks, key=lambda rank: -rank.score)  # stable: ties keep the texts' order


def _model_type(model: Capabilities) -> dict[str, Any]:
    if model.task == EMBEDDING.name:
        return {"embedding": {"pooling": model.artifact.pooling}}
    id2label = dict(enumerate(model.labels))
    labels = {"id2label": {str(i): label for i, label in id2label.items()},
              "label2id": {label: i for i, label in id2label.items()}}  # fmt: skip
    return {"reranker" if model.reranks else "classifier": labels}


# The tasks whose models TEI serves: its /info describes them.
TEI_TASKS = (EMBEDDING.name, CLASSIFICATION.name)


def tei_info(engine: Engine, model: Capabilities | None = None) -> dict[str, Any]:
    """TEI's /info fields (those TGI's lacks) for `model`, else the default embedding model, else the default
    classifier; empty when neither is served (or `model` is of another task)."""
    model = model or engine.default_model(EMBEDDING.name) or engine.default_model(CLASSIFICATION.name)
    if model is None or model.task not in TEI_TASKS:
        return {}
    settings = engine.settings
    return {
        "model_type": _model_type(model),
        "embedding_model_id": model.name,
        "max_input_length": model.max_input_tokens,
        "max_batch_tokens": model.max_input_tokens * settings.max_batch_size,
        "max_batch_requests": settings.max_batch_size,
        "auto_truncate": False,
        "tokenization_workers": 1,
    }


TEI_ERROR_TYPES = {429: "Overloaded", 503: "Unhealthy"}


class TeiError(BaseModel):
    """TEI's error body (TeiErrorMiddleware writes it on TEI_PATHS)."""

    error: str = Field(description="the message, prefixed with the field at fault")
    error_type: str = Field(description="Validation, Overloaded, Unhealthy or Backend")
    field: str | None = Field(None, description="the request field at fault (ours; TEI has none)")


TEI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": TeiError} for code in (400, 401, 404, 408, 413, 422, 429, 500, 503, 504)
}


class TeiErrorMiddleware(ErrorShapeMiddleware):
    """TEI's error body on /embed and /rerank; the message names the field at fault."""

    paths: ClassVar[tuple[str, ...]] = TEI_PATHS

    def shape(self, status: int, type: str, message: str, field: str | None) -> Any:
        kind = TEI_ERROR_TYPES.get(status, "Backend" if status >= 500 else "Validation")
        named = message if field in (None, "body") or message.startswith(f"{field}:") else f"{field}: {message}"
        return {"error": named, "error_type": kind, "field": field}
