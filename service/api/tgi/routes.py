"""TGI's protocol: `POST /generate` and `POST /generate_stream` (its SSE token and details events) on the
default generator, and the same answer for the Inference API's text-generation (service/api/hf/routes.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request

from contract.kinds import GENERATION
from service.api.asgi.lean_route import LeanRoute
from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import fields_as_sent
from service.api.sampling import tgi_sampling
from service.api.sse import event_stream, sse, stream_doc
from service.api.tgi.schemas import FINISH, TGI_FIELDS, TgiParameters, TgiRequest
from service.engine.capabilities import Capabilities
from service.engine.engine import Engine
from service.engine.tasks.generation.decoding import GenerationResult, TokenEvent
from service.engine.tasks.generation.scoring import TokenScore
from service.engine.tasks.generation.service import GenerationHandle, GenerationJob

router = APIRouter(tags=["hugging face"], route_class=LeanRoute)


def _job(body: TgiRequest, model: str) -> GenerationJob:
    p = body.parameters
    return GenerationJob(
        [body.inputs],
        ["inputs"],
        max_new_tokens=p.max_new_tokens,
        sampling=tgi_sampling(p),
        stop=tuple(p.stop),
        logprobs=p.top_n_tokens or 0,
        truncate=p.truncate,
        score_prompts=0 if p.details and p.decoder_input_details else None,
        model=model,
        constraint=p.grammar.constraint("parameters.grammar") if p.grammar is not None else None,
    )


async def _submit(engine: Engine, generator: Capabilities, body: TgiRequest) -> GenerationHandle:
    with fields_as_sent(TGI_FIELDS):
        return await engine.submit(_job(body, generator.name))


def _token(event: TokenEvent) -> dict[str, Any]:
    return {"id": event.id, "text": event.text, "logprob": event.logprob, "special": event.special}


def _top_tokens(event: TokenEvent) -> list[dict[str, Any]]:
    return [{"id": t.id, "text": t.text, "logprob": t.logprob, "special": False} for t in event.top_logprobs or []]


def _prefill(generator: Capabilities, scores: list[list[TokenScore]] | None) -> list[dict[str, Any]]:
    (prompt,) = scores or [[]]
    return [{"id": s.id, "text": generator.tokenizer.decode([s.id]), "logprob": s.logprob} for s in prompt]


async def _tgi_generate(
    engine: Engine, generator: Capabilities, body: TgiRequest, request: Request
) -> dict[str, Any]:
    p = body.parameters
    handle = await _submit(engine, generator, body)
    prefill = _prefill(generator, await unless_disconnected(request, handle.prompt_scores()))
    result: GenerationResult = await unless_disconnected(request, handle.result())
    text = (body.inputs + result.text) if p.return_full_text else result.text
    answer: dict[str, Any] = {"generated_text": text}
    if p.details:
        answer["details"] = {
            "finish_reason": FINISH[result.finish_reason],
            "generated_tokens": result.completion_tokens,
            "seed": result.seed if p.seed is not None or p.do_sample else None,
            "prefill": prefill,
            "tokens": [_token(t) for t in result.tokens],
            "top_tokens": [_top_tokens(t) for t in result.tokens] if p.top_n_tokens else None,
            "best_of_sequences": None,
        }
    return answer


def _tgi_error(type: str, message: str, field: str | None) -> str:
    """TGI's in-stream error event: `{"error": message, "error_type": kind}`."""
    return sse({"error": message, "error_type": type, "field": field})


async def _tgi_stream(engine: Engine, generator: Capabilities, body: TgiRequest, request: Request) -> Any:
    p = body.parameters
    handle = await _submit(engine, generator, body)
    (ids,) = handle.prompt_ids
    events: AsyncGenerator[TokenEvent | GenerationResult, None] = handle.events()
    held: list[TokenEvent] = []  # one token is held back: the last one goes out with the text and details

    def render(event: TokenEvent | GenerationResult) -> str:
        if isinstance(event, TokenEvent):
            out = _tgi_chunk(held[0], p, None, None) if held else ""
            held[:] = [event]
            return out
        text = (body.inputs + event.text) if p.return_full_text else event.text
        details = {
            "finish_reason": FINISH[event.finish_reason],
            "generated_tokens": event.completion_tokens,
            "seed": event.seed,
            "input_length": len(ids),
        }
        # An end token as the first token: no token event came (the end token is none); TGI sends it.
        assert generator.end_id is not None  # a generator's capabilities name its end token
        last = held[0] if held else TokenEvent(0, generator.end_id, event.tail, True)
        return _tgi_chunk(last, p, text, details)

    return await event_stream(request, events, render, _tgi_error)


def _tgi_chunk(token: TokenEvent, p: TgiParameters, text: str | None, details: dict[str, Any] | None) -> str:
    chunk = {
        "index": token.index + 1,
        "token": _token(token),
        "top_tokens": _top_tokens(token) if p.top_n_tokens else None,
        "generated_text": text,
        "details": details,
    }
    return sse(chunk)


async def tgi_answer(
    engine: Engine, generator: Capabilities, body: TgiRequest, request: Request, as_list: bool
) -> Any:
    """TGI's answer (or stream); the Inference API's text-generation gets it as a list."""
    if body.stream:
        return await _tgi_stream(engine, generator, body, request)
    answer = await _tgi_generate(engine, generator, body, request)
    return [answer] if as_list else answer


TGI_STREAM_DOC = stream_doc("TGI's `data:` token events, the last one with `generated_text` and `details`")


@router.post("/generate", summary="TGI: generate text", responses=TGI_STREAM_DOC)
async def tgi_generate(body: TgiRequest, engine: EngineDep, request: Request) -> Any:
    return await tgi_answer(engine, engine.resolve(None, GENERATION.name), body, request, as_list=False)


@router.post("/generate_stream", summary="TGI: generate text as Server-Sent Events", responses=TGI_STREAM_DOC)
async def tgi_generate_stream(body: TgiRequest, engine: EngineDep, request: Request) -> Any:
    streamed = body.model_copy(update={"stream": True})
    return await tgi_answer(engine, engine.resolve(None, GENERATION.name), streamed, request, as_list=False)
