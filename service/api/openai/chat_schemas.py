"""The bodies of OpenAI's chat completions (`POST /v1/chat/completions`), which TGI and huggingface_hub's
`chat_completion` speak too, with OpenAI's tool calling (service/api/openai/tool_calls.py). What this server cannot
do is refused by name: content parts other than text."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from service.api.errors import FieldError
from service.api.native.schemas import Request, Response, Usage, bounded
from service.api.openai.schemas import CHOICES_RULE, OpenAIResponse, OpenAISampling

ROLES = ("system", "user", "assistant", "developer", "tool")
# `model` values that name no model: TGI's own placeholder, and huggingface_hub's when its model is a URL.
PLACEHOLDER_MODELS = ("tgi", "dummy")
MAX_TOOLS = 128  # OpenAI's limit
MAX_TOOL_CALLS = 128  # in one assistant message
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class ContentPart(Request):
    """One part of a message's content: only text parts are supported (no images or audio)."""

    # A part of another type carries its own fields: allowed here, so that the error names its `type`.
    # The document states what is accepted: {"type": "text", "text": ...} and nothing else.
    model_config = ConfigDict(
        extra="allow", json_schema_extra={"additionalProperties": False, "required": ["type", "text"]}
    )

    type: str = Field(json_schema_extra={"const": "text"})
    text: str | None = Field(None, json_schema_extra={"type": "string"})

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content parts of type {value!r} are not supported: text parts only")
        return value

    @model_validator(mode="after")
    def _has_text(self) -> ContentPart:
        if self.text is None:
            raise FieldError("text", "a text part needs its text")
        if self.model_extra:
            raise FieldError(next(iter(self.model_extra)), "not a field of a text part")
        return self


class FunctionCall(Request):
    name: str = Field(max_length=64)
    arguments: str = Field(description="the arguments as a JSON object's text (the template gets the object)")


class MessageToolCall(Request):
    """A call an earlier assistant message made."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


def _given(field: str) -> dict[str, Any]:
    return {"properties": {field: {"not": {"type": "null"}}}, "required": [field]}


class ChatMessage(Request):
    # The rules of _tool_fields, stated in the document.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"if": {"anyOf": [{"not": {"required": ["content"]}},
                                  {"properties": {"content": {"type": "null"}}, "required": ["content"]}]},
                 "then": {"properties": {"role": {"const": "assistant"},
                                         "tool_calls": {"type": "array", "minItems": 1}},
                          "required": ["role", "tool_calls"]}},
                {"if": _given("tool_calls"), "then": {"properties": {"role": {"const": "assistant"}}}},
                {"if": {"properties": {"role": {"const": "tool"}}, "required": ["role"]},
                 "then": {"properties": {"tool_call_id": {"type": "string"}}, "required": ["tool_call_id"]}},
                {"if": _given("tool_call_id"), "then": {"properties": {"role": {"const": "tool"}}}},
            ]
        }
    )  # fmt: skip

    role: Literal["system", "user", "assistant", "developer", "tool"] = Field(
        description="developer is rendered as system (OpenAI's name for it on newer models); tool: a call's result"
    )
    content: str | Annotated[list[ContentPart], bounded()] | None = Field(
        None,
        description="text, or a list of text parts (joined with no separator); null only for an assistant's tool calls",
    )
    name: str | None = None
    tool_calls: Annotated[list[MessageToolCall], bounded(MAX_TOOL_CALLS, None)] | None = Field(
        None, description="an assistant message's calls"
    )
    tool_call_id: str | None = Field(None, description="a tool message's: the call it answers")

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise FieldError("content", f"Field required: a {self.role} message needs its content")
        if self.tool_calls is not None and self.role != "assistant":
            raise FieldError("tool_calls", "only an assistant message makes tool calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise FieldError("tool_call_id", "a tool message needs the id of the call it answers")
        if self.tool_call_id is not None and self.role != "tool":
            raise FieldError("tool_call_id", "only a tool message answers a call")
        return self


class FunctionDefinition(Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments; absent: none")
    strict: bool | None = Field(None, description="accepted: forced calls always follow the schema")


class ToolDefinition(Request):
    type: Literal["function"]
    function: FunctionDefinition

    def template_form(self) -> dict[str, Any]:
        """As apply_chat_template(tools=...) passes it to the template: the JSON-schema function dict."""
        function = {k: v for k, v in self.function.model_dump(exclude_unset=True).items() if v is not None}
        return {"type": "function", "function": function}


class NamedFunction(Request):
    name: str


class NamedToolChoice(Request):
    type: Literal["function"]
    function: NamedFunction


FORCED_CALL: dict[str, Any] = {
    "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
    "required": ["tool_choice"],
}


class ChatCompletionRequest(OpenAISampling):
    """OpenAI's chat completions, rendered with the model's chat template; plus `top_k`,
    `repetition_penalty` and `ignore_eos` (as vLLM)."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {
                        "properties": {"top_logprobs": {"type": "integer", "exclusiveMinimum": 0}},
                        "required": ["top_logprobs"],
                    },
                    "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
                },
                CHOICES_RULE,
                # tool_choice required or a named function: tools to call.
                {"if": FORCED_CALL, "then": {"properties": {"tools": {"type": "array", "minItems": 1}},
                                             "required": ["tools"]}},
            ],
            "examples": [
                {
                    "model": "generator",
                    "messages": [{"role": "user", "content": "Hello!"}],
                    "max_tokens": 16,
                    "seed": 42,
                }
            ],
        }
    )

    model: str | None = Field(
        None, description="a loaded generator with a chat template; absent, 'tgi' or 'dummy': the first such model"
    )
    messages: Annotated[list[ChatMessage], bounded()]
    max_tokens: int | None = Field(
        None, ge=1, description="max_completion_tokens' older name; default: the server's (within SERVE_MAX_NEW_TOKENS)"
    )
    max_completion_tokens: int | None = Field(None, ge=1, description="beyond the context: clamped (finish 'length')")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: the most likely alternatives")
    tools: Annotated[list[ToolDefinition], bounded(MAX_TOOLS, None)] | None = Field(
        None, description="functions the model may call, rendered by the chat template"
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None,
        description="default: auto with tools, none without; required and a named function are enforced by a "
        "grammar; none: the tools are not rendered",
    )
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call (default: any number)")
    # OpenAI's fields for its own stored completions: accepted and ignored, as vLLM does (nothing is stored).
    store: bool | None = Field(None, description="accepted and ignored: nothing is stored")
    metadata: dict[str, Any] | None = Field(None, max_length=16, description="accepted and ignored (with store)")

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "needs logprobs=true")
        names = [tool.function.name for tool in self.tools or []]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise FieldError(f"tools[{i}].function.name", f"{name!r} twice: function names must be unique")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise FieldError("tool_choice", "a tool call needs tools to call: send tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            name = self.tool_choice.function.name
            raise FieldError("tool_choice.function.name", f"no tool named {name!r} among tools")
        if self.tool_mode in ("required", "named") and (constraint := self.constraint()) is not None:
            field = constraint.field.split(".")[0]
            raise FieldError(field, f"tool_choice forces a tool call, whose form is set: no {field} with it")
        return self

    @property
    def tool_mode(self) -> Literal["none", "auto", "required", "named"]:
        if not self.tools or self.tool_choice == "none":
            return "none"
        if self.tool_choice is None:
            return "auto"
        return "named" if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        """The field the client set the budget with, for errors about it."""
        if self.max_completion_tokens is None and self.max_tokens is not None:
            return "max_tokens"
        return "max_completion_tokens"


class ChatTopLogprob(Response):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(Response):
    content: list[ChatTokenLogprob] | None


class CalledFunction(Response):
    name: str
    arguments: str = Field(description="JSON text")


class ToolCall(Response):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatCompletionMessage(Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="null when the message is tool calls only")
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(Response):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "error"]


class ChatCompletionResponse(OpenAIResponse):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
