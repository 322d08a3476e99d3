"""The bodies of OpenAI's chat completions (`POST /v1/chat/completions`), which TGI and huggingface_hub's
`chat_completion` speak too. What this server cannot do is refused by name: content parts other than text,
tool calling."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from service.api.errors import FieldError
from service.api.openai_schemas import CHOICES_RULE, OpenAIResponse, OpenAISampling
from service.api.schemas import Request, Response, Usage, bounded

ROLES = ("system", "user", "assistant", "developer")
# `model` values that name no model: TGI's own placeholder, and huggingface_hub's when its model is a URL.
PLACEHOLDER_MODELS = ("tgi", "dummy")
MAX_TOOLS = 128  # OpenAI's limit


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


class ChatMessage(Request):
    role: Literal["system", "user", "assistant", "developer"] = Field(
        description="developer is rendered as system (OpenAI's name for it on newer models)"
    )
    content: str | Annotated[list[ContentPart], bounded()] = Field(
        description="text, or a list of text parts (joined with no separator)"
    )
    name: str | None = None


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
                {
                    "if": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
                    "then": {"properties": {"tool_choice": {"const": "none"}}, "required": ["tool_choice"]},
                },
                CHOICES_RULE,
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
    tools: Annotated[list[dict[str, Any]], bounded(MAX_TOOLS, None)] | None = Field(
        None, description="only with tool_choice 'none' (no tool calls)"
    )
    tool_choice: Literal["none"] | None = Field(None, description="'none' only: tool calling is not supported")

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _no_tool_calls(cls, value: Any) -> Any:
        if value is not None and value != "none":
            raise ValueError(f"tool calling is not supported: only 'none', not {value!r}")
        return value

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        if self.tools and self.tool_choice != "none":
            raise FieldError("tools", "tool calling is not supported: send no tools, or tool_choice 'none'")
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "needs logprobs=true")
        return self

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


class ChatCompletionMessage(Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(Response):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "error"]


class ChatCompletionResponse(OpenAIResponse):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
