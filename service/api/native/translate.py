"""POST /v1/translate: one text or a list; greedy, beam search with n-best, or sampling; greedy and
sampled translations of one text can be streamed as Server-Sent Events."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.api.asgi.lean_route import LeanRoute
from service.api.deps import EngineDep, unless_disconnected
from service.api.native.schemas import TranslateRequest, TranslateResponse, Translation, TranslationHypothesis
from service.api.responses import large_json
from service.api.sampling import translation_params
from service.api.sse import event_stream, sse, stream_doc
from service.engine.tasks.translation.decoding import TranslationPiece, TranslationResult
from service.engine.tasks.translation.service import TranslationJob

router = APIRouter(tags=["translation"], route_class=LeanRoute)

STREAM_DOC = stream_doc(
    "`event: token` per target token (`{type, index, id, text}`), then `event: done` "
    "(`{type, translation}`, the same object as in `translations`)"
)


def _translation(result: TranslationResult, n_best: int) -> Translation:
    hypotheses = [
        TranslationHypothesis(text=h.text, score=h.score, output_tokens=len(h.token_ids)) for h in result.hypotheses
    ]
    best = hypotheses[0]
    return Translation(
        text=best.text,
        score=best.score,
        input_tokens=result.input_tokens,
        output_tokens=best.output_tokens,
        n_best=hypotheses if n_best > 1 else None,
        attention=result.attention,
    )


def _event(event: TranslationPiece | TranslationResult) -> str:
    if isinstance(event, TranslationPiece):
        return sse({"type": "token", "index": event.index, "id": event.id, "text": event.text}, "token")
    translation = _translation(event, n_best=1).model_dump(exclude_none=True)
    return sse({"type": "done", "translation": translation}, "done")


@router.post("/v1/translate", response_model=TranslateResponse, response_model_exclude_none=True, responses=STREAM_DOC)
async def translate(body: TranslateRequest, engine: EngineDep, request: Request) -> Any:
    texts = [body.text] if isinstance(body.text, str) else body.text
    fields = ["text"] if isinstance(body.text, str) else [f"text[{i}]" for i in range(len(texts))]
    languages = (body.source_lang, body.target_lang)
    handle = await engine.submit(TranslationJob(texts, fields, translation_params(body), body.model, *languages))
    if body.stream:
        return await event_stream(request, handle.events(), _event)
    results = await unless_disconnected(request, handle.results())
    response = TranslateResponse(model=handle.model, translations=[_translation(r, body.n_best) for r in results])
    return await large_json(response) if body.return_attention else response
