"""POST /v1/chat/completions: OpenAI's chat completions (also TGI's and huggingface_hub's `chat_completion`).

The engine renders the messages with the model's own chat template (service/engine/tasks/generation/chat_template.py)
into one prompt, tokenized without adding special tokens (the template writes them), and generates through
the same engine job as /v1/completions (`openai_job`). A model without a template is refused with a 400 that points
to /v1/completions."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request

from contract.kinds import GENERATION
from service.api.asgi.lean_route import LeanRoute
from service.api.asgi.tracing import new_request_id
from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import ApiError, fields_as_sent
from service.api.openai.chat_schemas import (
    PLACEHOLDER_MODELS,
    ChatChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatTokenLogprob,
    ChatTopLogprob,
    MessageToolCall,
    NamedToolChoice,
    ToolCall,
)
from service.api.openai.common import FINISH, openai_job, openai_stream, usage
from service.api.openai.tool_calls import Function, ToolFormat, ToolStream, tool_constraint, tool_format
from service.api.sse import sse, streaming_response
from service.engine.capabilities import Capabilities
from service.engine.engine import Engine
from service.engine.errors import InvalidInput
from service.engine.tasks.generation.chat_template import ChatMessages
from service.engine.tasks.generation.constraints import Constraint
from service.engine.tasks.generation.decoding import GenerationResult, TokenEvent

router = APIRouter(tags=["openai"], route_class=LeanRoute)

PATH = "/v1/chat/completions"
STREAM_DOC = (
    "JSON, or with `stream: true` an event stream of `chat.completion.chunk` objects: per choice a first "
    "delta with the role, then content deltas, then one with its finish_reason; with "
    "`stream_options.include_usage` a last chunk with no choices and the usage; then `data: [DONE]`."
)


def chat_models(engine: Engine) -> list[str]:
    """The loaded generators that carry a chat template, the default generator first."""
    return [name for name, model in engine.served().items() if model.chat_template is not None]


def chat_generator(engine: Engine, model: str | None) -> Capabilities:
    """The named generator, or for no name (or TGI's placeholders) the first with a chat template; a 400
    when it has none."""
    if model is None or (model in PLACEHOLDER_MODELS and model not in engine.capabilities):
        with_template = chat_models(engine)
        model = with_template[0] if with_template else None
    generator = engine.resolve(model, GENERATION.name)
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
    if message.content is None:  # an assistant's tool calls alone
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text or "" for part in message.content)


def _template_calls(calls: list[MessageToolCall], field: str) -> list[dict[str, Any]]:
    """An assistant's calls as templates take them (transformers' form): the arguments as an object."""
    out = []
    for j, call in enumerate(calls):
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError as exc:
            where = f"{field}[{j}].function.arguments"
            raise InvalidInput(f"a call's arguments must be JSON text: {exc}", where) from None
        if not isinstance(arguments, dict):
            raise InvalidInput("a call's arguments must be a JSON object", f"{field}[{j}].function.arguments")
        function = {"name": call.function.name, "arguments": arguments}
        out.append({"id": call.id, "type": "function", "function": function})
    return out


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as apply_chat_template takes them: plain dicts, no null fields; `developer` (OpenAI's
    newer name for the system role) as system, which is the role templates know."""
    out = []
    for i, m in enumerate(messages):
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _content(m)}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_calls:
            message["tool_calls"] = _template_calls(m.tool_calls, f"messages[{i}].tool_calls")
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _finish(result: GenerationResult, called: bool) -> str:
    """OpenAI's finish_reason: tool_calls when the model ended after calling (the budget's end stays length)."""
    return "tool_calls" if called and result.finish_reason != "length" else FINISH[result.finish_reason]


@dataclasses.dataclass(frozen=True)
class _Tools:
    """A request's tool calling: the model's format (None: the output is not parsed) and the most calls."""

    format: ToolFormat | None = None
    max_calls: int | None = None

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if self.format is None:
            return text, []
        content, calls = self.format.parse(text)
        if not calls:
            return text, []
        return content, [ToolCall.model_validate(c.as_openai()) for c in calls[: self.max_calls]]


def _tool_calling(body: ChatCompletionRequest, generator: Capabilities) -> tuple[_Tools, Constraint | None]:
    """The request's tool format and, for `required` or a named function, the grammar that forces a call."""
    template = generator.chat_template
    if body.tool_mode == "none" or template is None or not body.tools:
        return _Tools(), None
    fmt = tool_format(template)
    tools = _Tools(fmt, 1 if body.parallel_tool_calls is False else None)
    functions = [Function(t.function.name, t.function.parameters) for t in body.tools]
    if isinstance(body.tool_choice, NamedToolChoice):
        named = body.tool_choice.function.name
        return tools, tool_constraint(fmt, [f for f in functions if f.name == named], many=False)
    if body.tool_mode == "required":
        return tools, tool_constraint(fmt, functions, many=tools.max_calls is None)
    return tools, None


def _token(token: str, logprob: float) -> ChatTopLogprob:
    """A token's own text (the engine decodes it alone, as /v1/completions' logprobs show it)."""
    return ChatTopLogprob(token=token, logprob=logprob, bytes=list(token.encode()))


def chat_logprobs(tokens: list[TokenEvent]) -> ChatLogprobs:
    content = []
    for e in tokens:
        chosen = _token(e.token, e.logprob if e.logprob is not None else 0.0)
        top = [_token(t.text, t.logprob) for t in e.top_logprobs or []]
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)


class _ChatChunks:
    """The `chat.completion.chunk` events of one streamed response (the StreamChunks of completions.py)."""

    def __init__(
        self, model: str, body: ChatCompletionRequest, prompt_tokens: int, tools: _Tools
    ) -> None:
        self.id, self.created, self.model = f"chatcmpl-{new_request_id()}", int(time.time()), model
        self.body, self.prompt_tokens = body, prompt_tokens
        self.include_usage = body.stream_options is not None and body.stream_options.include_usage
        self.results: list[GenerationResult] = []
        # Per choice, with tools: the text that may be a call is held back until the call closes.
        fmt = tools.format
        self.tools = {i: ToolStream(fmt, tools.max_calls) for i in range(body.n)} if fmt is not None else {}

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

    def _delta(self, index: int, text: str, last: bool = False) -> dict[str, Any]:
        """The content and the closed tool calls `text` brings (with `last`, all that was held back)."""
        stream = self.tools.get(index)
        if stream is None:
            return {"content": text} if text else {}
        content, calls = stream.feed(text)
        if last:
            rest, more = stream.close()
            content, calls = content + rest, calls + more
        delta: dict[str, Any] = {"content": content} if content else {}
        if calls:
            first = stream.calls - len(calls)
            delta["tool_calls"] = [call.as_openai(first + j) for j, call in enumerate(calls)]
        return delta

    def event(self, index: int, event: TokenEvent | GenerationResult) -> str | None:
        if isinstance(event, GenerationResult):
            self.results.append(event)
            delta = self._delta(index, event.tail, last=True)  # the tail: held back as a possible stop string
            called = index in self.tools and self.tools[index].calls > 0
            finish = _finish(event, called)
            return self.chunk([self._choice(index, delta, finish_reason=finish)])
        if not event.text and not self.body.logprobs:
            return None  # nothing to show yet (an incomplete character, or the end token)
        delta = self._delta(index, event.text)
        if not delta and not self.body.logprobs:
            return None  # held back: perhaps a tool call
        logprobs = chat_logprobs([event]).model_dump() if self.body.logprobs else None
        return self.chunk([self._choice(index, delta, logprobs)])

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
    tools, forced = _tool_calling(body, generator)
    rendered_tools = [t.template_form() for t in body.tools or []] if tools.format is not None else None
    messages = ChatMessages(template_messages(body.messages), rendered_tools)  # rendered by the engine
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    job = openai_job(body, messages, ["messages"], body.max_new_tokens, logprobs, generator.name)
    if forced is not None:
        job = dataclasses.replace(job, constraint=forced)
    with fields_as_sent({"max_new_tokens": body.max_tokens_field}):
        handle = await engine.submit(job)
    prompt_tokens = len(handle.prompt_ids[0])
    if body.stream:
        chunks = _ChatChunks(generator.name, body, prompt_tokens, tools)
        return streaming_response(request, openai_stream(chunks, handle.indexed_events(), f"POST {PATH}"))
    results = await unless_disconnected(request, handle.results())
    choices = []
    for i, r in enumerate(results):
        content, calls = tools.parse(r.text)
        choices.append(
            ChatChoice(
                index=i,
                message=ChatCompletionMessage(content=content, tool_calls=calls),
                logprobs=chat_logprobs(r.tokens) if body.logprobs else None,
                finish_reason=_finish(r, bool(calls)),
            )
        )
    return ChatCompletionResponse(
        id=f"chatcmpl-{new_request_id()}",
        created=int(time.time()),
        model=generator.name,
        choices=choices,
        usage=usage(results, prompt_tokens),
    )
