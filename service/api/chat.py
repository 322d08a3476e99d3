"""POST /v1/chat/completions: OpenAI's chat completions (also TGI's and huggingface_hub's `chat_completion`).

The messages are rendered with the model's own chat template (service/engine/chat_template.py) into one
prompt, tokenized without adding special tokens (the template writes them), and generated through the same
engine job as /v1/completions (`openai_job`). A model without a template is refused with a 400 that points
to /v1/completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request

from service.api.chat_schemas import (
    PLACEHOLDER_MODELS,
    ChatChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatTokenLogprob,
    ChatTopLogprob,
)
from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import ApiError, fields_as_sent
from service.api.lean_route import LeanRoute
from service.api.openai_common import FINISH, openai_job, openai_stream, usage
from service.api.sse import sse, streaming_response
from service.api.tracing import new_request_id
from service.engine.engine import Engine
from service.engine.generation import GenerationResult, TokenEvent
from service.engine.generation_service import GenerationService

router = APIRouter(tags=["openai"], route_class=LeanRoute)

PATH = "/v1/chat/completions"
STREAM_DOC = (
    "JSON, or with `stream: true` an event stream of `chat.completion.chunk` objects: per choice a first "
    "delta with the role, then content deltas, then one with its finish_reason; with "
    "`stream_options.include_usage` a last chunk with no choices and the usage; then `data: [DONE]`."
)


def chat_models(engine: Engine) -> list[str]:
    """The loaded generators that carry a chat template, the default generator first."""
    generators = [engine.generator, *engine.services.values()]
    found = [s for s in generators if isinstance(s, GenerationService) and s.chat_template is not None]
    return list(dict.fromkeys(s.name for s in found))


def chat_generator(engine: Engine, model: str | None) -> GenerationService:
    """The named generator, or for no name (or TGI's placeholders) the first with a chat template; a 400
    when it has none."""
    if model is None or (model in PLACEHOLDER_MODELS and model not in engine.services):
        with_template = chat_models(engine)
        generator = engine.require(GenerationService, with_template[0] if with_template else None)
    else:
        generator = engine.require(GenerationService, model)
    if generator.chat_template is None:
        raise ApiError(
            400,
            "no_chat_template",
            f"model {generator.name!r} has no chat template, so it cannot render chat messages; send a prompt "
            "to POST /v1/completions instead (a model imported from a checkpoint with a chat_template has one)",
            "model",
        )
    return generator


def _content(message: ChatMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text or "" for part in message.content)


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as apply_chat_template takes them: plain dicts, no null fields; `developer` (OpenAI's
    newer name for the system role) as system, which is the role templates know."""
    out = []
    for m in messages:
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _content(m)}
        if m.name is not None:
            message["name"] = m.name
        out.append(message)
    return out


async def render(generator: GenerationService, messages: list[dict[str, Any]]) -> str:
    """The prompt text, rendered in the template's sandbox process (bounded in time and memory) from a worker
    thread, so that the event loop (and every stream on it) never waits for a template."""
    template = generator.chat_template
    assert template is not None  # chat_generator refuses a model without one
    return await asyncio.to_thread(template.render, messages)


def _token(token_id: int, logprob: float, generator: GenerationService) -> ChatTopLogprob:
    token = generator.tokenizer.decode([token_id])  # the token's own text, as /v1/completions' logprobs
    return ChatTopLogprob(token=token, logprob=logprob, bytes=list(token.encode()))


def chat_logprobs(tokens: list[TokenEvent], generator: GenerationService) -> ChatLogprobs:
    content = []
    for e in tokens:
        chosen = _token(e.id, e.logprob if e.logprob is not None else 0.0, generator)
        top = [_token(t.id, t.logprob, generator) for t in e.top_logprobs or []]
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)


class _ChatChunks:
    """The `chat.completion.chunk` events of one streamed response (the StreamChunks of completions.py)."""

    def __init__(
        self, model: str, body: ChatCompletionRequest, prompt_tokens: int, generator: GenerationService
    ) -> None:
        self.id, self.created, self.model = f"chatcmpl-{new_request_id()}", int(time.time()), model
        self.body, self.prompt_tokens, self.generator = body, prompt_tokens, generator
        self.include_usage = body.stream_options is not None and body.stream_options.include_usage
        self.results: list[GenerationResult] = []

    def chunk(self, choices: list[dict[str, Any]], with_usage: bool = False) -> str:
        data: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:  # as OpenAI: null on every chunk but the last
            data["usage"] = usage(self.results, self.prompt_tokens).model_dump() if with_usage else None
        return sse(data)

    @staticmethod
    def _choice(
        index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def start(self) -> list[str]:
        return [self.chunk([self._choice(i, {"role": "assistant", "content": ""})]) for i in range(self.body.n)]

    def event(self, index: int, event: TokenEvent | GenerationResult) -> str | None:
        if isinstance(event, GenerationResult):
            self.results.append(event)
            delta = {"content": event.tail} if event.tail else {}  # text held back as a possible stop string
            return self.chunk([self._choice(index, delta, finish_reason=FINISH[event.finish_reason])])
        if not event.text and not self.body.logprobs:
            return None  # nothing to show yet (an incomplete character, or the end token)
        logprobs = chat_logprobs([event], self.generator).model_dump() if self.body.logprobs else None
        return self.chunk([self._choice(index, {"content": event.text}, logprobs)])

    def end(self) -> list[str]:
        last = [self.chunk([], with_usage=True)] if self.include_usage else []
        return [*last, sse("[DONE]")]


@router.post(
    PATH,
    response_model=ChatCompletionResponse,
    responses={200: {"description": STREAM_DOC, "content": {"text/event-stream": {}}}},
)
async def chat_completions(body: ChatCompletionRequest, engine: EngineDep, request: Request) -> Any:
    generator = chat_generator(engine, body.model)
    prompt = await render(generator, template_messages(body.messages))  # a 422 if the template refuses
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    job = openai_job(body, [prompt], ["messages"], body.max_new_tokens, logprobs, generator.name, chat=True)
    with fields_as_sent({"max_new_tokens": body.max_tokens_field}):
        handle = await engine.submit(job)
    prompt_tokens = len(handle.prompt_ids[0])
    if body.stream:
        chunks = _ChatChunks(generator.name, body, prompt_tokens, generator)
        return streaming_response(request, openai_stream(chunks, handle.indexed_events(), f"POST {PATH}"))
    results = await unless_disconnected(request, handle.results())
    choices = [
        ChatChoice(
            index=i,
            message=ChatCompletionMessage(content=r.text),
            logprobs=chat_logprobs(r.tokens, generator) if body.logprobs else None,
            finish_reason=FINISH[r.finish_reason],
        )
        for i, r in enumerate(results)
    ]
    return ChatCompletionResponse(
        id=f"chatcmpl-{new_request_id()}",
        created=int(time.time()),
        model=generator.name,
        choices=choices,
        usage=usage(results, prompt_tokens),
    )
