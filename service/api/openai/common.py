"""What OpenAI's completions and chat completions share: the engine job of a request, finish reasons, usage,
and the stream (its chunks come from each route; errors in-band, then the end marker)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from service.api.errors import ENGINE_STATUS, log_internal_error
from service.api.native.schemas import Usage
from service.api.openai.errors import openai_error_body
from service.api.openai.schemas import OpenAISampling
from service.api.sampling import sampling_given, sampling_params, stop_strings
from service.api.sse import sse
from service.engine.errors import EngineError
from service.engine.tasks.generation.chat_template import ChatMessages
from service.engine.tasks.generation.decoding import GenerationResult, TokenEvent
from service.engine.tasks.generation.service import GenerationJob

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "error": "error"}


def openai_job(
    body: OpenAISampling,
    prompts: list[str | list[int]] | ChatMessages,
    fields: list[str],
    max_new_tokens: int | None,
    logprobs: int | None,
    model: str | None,
    score_prompts: int | None = None,
) -> GenerationJob:
    """The engine job of an OpenAI request (completions, chat completions): one sequence per (prompt, choice),
    choice i of prompt j is j * n + i, as OpenAI numbers them. Chat messages are rendered by the model's
    template (no special tokens added) and without a budget fill the context, as OpenAI's chat does."""
    chat, texts = (prompts, []) if isinstance(prompts, ChatMessages) else (None, prompts)
    return GenerationJob(
        texts,
        fields,
        max_new_tokens=max_new_tokens,
        sampling=sampling_params(
            body,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
        ),
        sampling_given=sampling_given(body),
        stop=stop_strings(body.stop),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        n=body.n,
        score_prompts=score_prompts,
        model=model,
        fill_context_by_default=chat is not None,
        constraint=body.constraint(),
        chat=chat,
    )


def usage(results: list[GenerationResult], prompt_tokens: int) -> Usage:
    completion = sum(r.completion_tokens for r in results)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion, total_tokens=prompt_tokens + completion)


class StreamChunks(Protocol):
    """What an OpenAI stream is built from: the chunks before the first token, one per event, the last ones."""

    def start(self) -> list[str]: ...

    def event(self, index: int, event: TokenEvent | GenerationResult) -> str | None: ...

    def end(self) -> list[str]: ...


async def openai_stream(
    chunks: StreamChunks, events: AsyncGenerator[tuple[int, Any], None], where: str = "POST /v1/completions"
) -> AsyncGenerator[str, None]:
    try:
        for chunk in chunks.start():
            yield chunk
        async for index, event in events:
            text = chunks.event(index, event)
            if text is not None:
                yield text
        for chunk in chunks.end():
            yield chunk
    except EngineError as exc:  # in-band, then the end marker OpenAI clients wait for
        yield sse(openai_error_body(ENGINE_STATUS.get(type(exc), 500), exc.type, exc.message, exc.field))
        yield sse("[DONE]")
    except Exception as exc:
        log_internal_error(exc, f"{where} (stream)")
        yield sse(openai_error_body(500, "internal_error", "internal server error", None))
        yield sse("[DONE]")
    finally:
        await events.aclose()
