"""POST /v1/classify: one text, a list, or sentence pairs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.api.asgi.lean_route import LeanRoute
from service.api.deps import EngineDep, unless_disconnected
from service.api.native.schemas import ClassificationResult, ClassifyRequest, ClassifyResponse, LabelScore
from service.api.responses import large_json
from service.engine.tasks.classification.service import Classification, ClassificationJob, ClassifyInput

router = APIRouter(tags=["classification"], route_class=LeanRoute)


def _result(c: Classification) -> ClassificationResult:
    return ClassificationResult(
        label=c.label,
        score=c.score,
        scores=c.scores,
        logits=c.logits,
        top_k=[LabelScore(label=label, score=score) for label, score in c.top_k] if c.top_k else None,
        input_tokens=c.input_tokens,
        attention=c.attention,
    )


@router.post("/v1/classify", response_model=ClassifyResponse, response_model_exclude_none=True)
async def classify(body: ClassifyRequest, engine: EngineDep, request: Request) -> Any:
    if isinstance(body.text, str):
        inputs: list[ClassifyInput] = [body.text]
        fields = ["text"]
    else:
        inputs = [item if isinstance(item, str) else (item[0], item[1]) for item in body.text]
        fields = [f"text[{i}]" for i in range(len(inputs))]
    job = ClassificationJob(
        inputs,
        fields,
        body.top_k,
        body.return_attention,
        truncate=body.truncate,
        truncation_direction=body.truncation_direction,
        model=body.model,
    )
    handle = await engine.submit(job)
    results = await unless_disconnected(request, handle.results())
    response = ClassifyResponse(model=handle.model, results=[_result(r) for r in results])
    return await large_json(response) if body.return_attention else response
