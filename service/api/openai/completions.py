"""POST /v1/completions: the OpenAI completions API over the generator, so OpenAI clients work as-is."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request

from contract.kinds import GENERATION
from service.api.asgi.lean_route import LeanRoute
from service.api.asgi.tracing import new_request_id
from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import fields_as_sent
from service.api.native.schemas import Usage
from service.api.openai.common import FINISH, openai_job, openai_stream, usage
from service.api.openai.schemas import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from service.api.sse import sse, streaming_response
from service.engine.capabilities import Capabilities
from service.engine.tasks.generation.decoding import GenerationResult, TokenEvent
from service.engine.tasks.generation.scoring import TokenScore
from service.engine.tasks.generation.service import GenerationJob

router = APIRouter(tags=["openai"], route_class=LeanRoute)

FIELDS = {"max_new_tokens": "max_tokens"}  # the engine's option names as this API spells them
_END = object()


def _prompts(body: CompletionRequest) -> list[str | list[int]]:
    p = body.prompt
    if isinstance(p, str):
        return [p]
    items: list[str | list[int] | int] = [*p]
    ids = [x for x in items if isinstance(x, int)]
    if len(ids) == len(items):  # one prompt of token ids
        return [ids]
    return [x for x in items if not isinstance(x, int)]


def _job(body: CompletionRequest, model: str) -> GenerationJob:
    prompts = _prompts(body)
    fields = ["prompt"] if len(prompts) == 1 else [f"prompt[{j}]" for j in range(len(prompts))]
    score_prompts = body.logprobs if body.echo else None  # the echoed prompt's logprobs
    return openai_job(body, prompts, fields, body.max_tokens, body.logprobs, model, score_prompts=score_prompts)


def _echoes(body: CompletionRequest, prompt_ids: list[list[int]], generator: Capabilities) -> list[str]:
    """The echoed text of each choice ("" without echo)."""
    if not body.echo:
        return [""] * (len(prompt_ids) * body.n)
    prompts = _prompts(body)
    texts = [
        p if isinstance(p, str) else generator.tokenizer.decode(ids) for p, ids in zip(prompts, prompt_ids, strict=True)
    ]
    return [text for text in texts for _ in range(body.n)]


def _prompt_logprobs(scores: list[TokenScore], generator: Capabilities) -> CompletionLogprobs:
    """The echoed prompt's logprobs: the first token has none (null), as in OpenAI's API."""
    texts = [generator.tokenizer.decode([t.id]) for t in scores]
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    top = [{generator.tokenizer.decode([i]): lp for i, lp in t.top} if t.top is not None else None for t in scores]
    return CompletionLogprobs(
        tokens=texts,
        token_logprobs=[t.logprob for t in scores],
        top_logprobs=top if any(x is not None for x in top) else None,
        text_offset=offsets,
    )


def _joined(first: CompletionLogprobs | None, then: CompletionLogprobs | None) -> CompletionLogprobs | None:
    if first is None or then is None:
        return first or then
    top = None
    if first.top_logprobs is not None or then.top_logprobs is not None:
        top = (first.top_logprobs or [None] * len(first.tokens)) + (then.top_logprobs or [{}] * len(then.tokens))
    return CompletionLogprobs(
        tokens=first.tokens + then.tokens,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        top_logprobs=top,
        text_offset=first.text_offset + then.text_offset,
    )


def _scored_prompts(
    scores: list[list[TokenScore]] | None, prompts: int, n: int, generator: Capabilities
) -> list[CompletionLogprobs | None]:
    """One entry per choice: the prompt's logprobs when echo and logprobs are both asked for."""
    if scores is None:
        return [None] * (prompts * n)
    return [_prompt_logprobs(s, generator) for s in scores for _ in range(n)]


def _echo_only(prompt_ids: list[list[int]], n: int) -> list[GenerationResult]:
    """max_tokens 0: a finished, empty completion per choice."""
    return [GenerationResult("", "length", len(ids), 0, 0, []) for ids in prompt_ids for _ in range(n)]


def _logprobs(tokens: list[TokenEvent], offset: int) -> CompletionLogprobs:
    texts = [t.token for t in tokens]  # each token's own text
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    top: list[dict[str, float] | None] = [
        {t.text: t.logprob for t in e.top_logprobs} if e.top_logprobs else {} for e in tokens
    ]
    return CompletionLogprobs(
        tokens=texts,
        token_logprobs=[e.logprob if e.logprob is not None else 0.0 for e in tokens],
        top_logprobs=top if any(top) else None,
        text_offset=offsets,
    )


class _Chunks:
    """Builds the OpenAI stream chunks of one response."""

    def __init__(
        self,
        model: str,
        body: CompletionRequest,
        prompt_ids: list[list[int]],
        echoes: list[str],
        echo_logprobs: list[CompletionLogprobs | None],
        generator: Capabilities,
    ) -> None:
        self.id, self.created, self.model = f"cmpl-{new_request_id()}", int(time.time()), model
        self.body, self.prompt_ids, self.echoes, self.generator = body, prompt_ids, echoes, generator
        self.echo_logprobs = echo_logprobs
        self.offsets = [len(e) for e in echoes]
        self.results: list[GenerationResult] = []

    def chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> str:
        data = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.model_dump() if usage else None,
        }
        return sse(data)

    def start(self) -> list[str]:
        return [
            self.chunk([self._choice(i, e, lp.model_dump() if lp else None)])
            for i, (e, lp) in enumerate(zip(self.echoes, self.echo_logprobs, strict=True))
            if e
        ]

    def event(self, index: int, event: TokenEvent | GenerationResult) -> str | None:
        if isinstance(event, GenerationResult):
            self.results.append(event)
            # `tail`: text the end released that no token carried (held back as a possible stop string)
            return self.chunk([self._choice(index, event.tail, finish_reason=FINISH[event.finish_reason])])
        if not event.text and self.body.logprobs is None:
            return None  # nothing to show yet (an incomplete character, or the eos token)
        logprobs = None
        if self.body.logprobs is not None:
            logprobs = _logprobs([event], self.offsets[index]).model_dump()
        self.offsets[index] += len(event.text)
        return self.chunk([self._choice(index, event.text, logprobs)])

    def end(self) -> list[str]:
        chunks = []
        options = self.body.stream_options
        if options is not None and options.include_usage:
            prompt_tokens = sum(len(ids) for ids in self.prompt_ids)
            chunks.append(self.chunk([], usage(self.results, prompt_tokens)))
        return [*chunks, sse("[DONE]")]

    @staticmethod
    def _choice(
        index: int, text: str, logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


@router.post(
    "/v1/completions", response_model=CompletionResponse, responses={200: {"content": {"text/event-stream": {}}}}
)
async def completions(body: CompletionRequest, engine: EngineDep, request: Request) -> Any:
    generator = engine.resolve(body.model, GENERATION.name)  # 404 model_not_loaded (OpenAI's code: model_not_found)
    with fields_as_sent(FIELDS):
        handle = await engine.submit(_job(body, generator.name))
    prompt_ids = handle.prompt_ids
    scores = await unless_disconnected(request, handle.prompt_scores())
    echoes = _echoes(body, prompt_ids, generator)
    echo_logprobs = _scored_prompts(scores, len(prompt_ids), body.n, generator)
    if body.stream:
        chunks = _Chunks(generator.name, body, prompt_ids, echoes, echo_logprobs, generator)
        events = handle.indexed_events() if handle.sequences else _echoed(body, prompt_ids)
        return streaming_response(request, openai_stream(chunks, events))
    if handle.sequences:
        results = await unless_disconnected(request, handle.results())
    else:
        results = _echo_only(prompt_ids, body.n)
    choices = [
        CompletionChoice(
            text=echo + r.text,
            index=i,
            logprobs=_joined(lp, _logprobs(r.tokens, len(echo))) if body.logprobs is not None else None,
            finish_reason=FINISH[r.finish_reason],
        )
        for i, (r, echo, lp) in enumerate(zip(results, echoes, echo_logprobs, strict=True))
    ]
    return CompletionResponse(
        id=f"cmpl-{new_request_id()}",
        created=int(time.time()),
        model=generator.name,
        choices=choices,
        usage=usage(results, sum(len(ids) for ids in prompt_ids)),  # each prompt counted once, as OpenAI does
    )


async def _echoed(body: CompletionRequest, prompt_ids: list[list[int]]) -> AsyncGenerator[tuple[int, Any], None]:
    """The events of an echo-only (max_tokens 0) stream: each choice finishes at once."""
    for index, result in enumerate(_echo_only(prompt_ids, body.n)):
        yield index, result
