"""OpenAI's completions: the request (with the sampling options chat completions shares) and the response."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticKnownError

from service.api.errors import FieldError
from service.api.native.schemas import (
    MAX_LOGIT_BIAS,
    MAX_SEED,
    MAX_TOP_K,
    TOKEN_ID,
    TOKEN_ID_DIGITS,
    NonEmptyText,
    Request,
    Response,
    TokenIds,
    Usage,
    bounded,
    requires,
)
from service.api.structured import StructuredFields

# --- OpenAI completions --------------------------------------------------------------------------


class StreamOptions(Request):
    include_usage: bool = False


# best_of, when given, is n: one branch per n (an absent n is 1). One anyOf, not an if/then per value: a
# schema with many of those is a product of alternatives that schemathesis cannot generate from.
CHOICES_RULE: dict[str, Any] = {
    "anyOf": [
        {"properties": {"n": {"const": n}, "best_of": {"enum": [n, None]}}, **({"required": ["n"]} if n > 1 else {})}
        for n in range(1, 17)
    ]
}


class OpenAISampling(StructuredFields):
    """The sampling options OpenAI's completions and chat completions share, plus `top_k`,
    `repetition_penalty` and `ignore_eos` (as vLLM)."""

    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: NonEmptyText | Annotated[list[NonEmptyText], bounded(4, None)] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None,
        max_length=MAX_LOGIT_BIAS,
        description="token id (decimal string) -> bias added to its logit",
        json_schema_extra={"propertyNames": {"pattern": f"^{TOKEN_ID.pattern}$"}},
    )
    user: str | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="0 = off; beyond the vocabulary: all")
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    ignore_eos: bool = False

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _few_entries(cls, value: Any) -> Any:
        """Counted before the entries are checked: a dict's length is checked after them, each wrong one an
        error of its own."""
        if isinstance(value, dict) and len(value) > MAX_LOGIT_BIAS:
            ctx = {"field_type": "Dictionary", "max_length": MAX_LOGIT_BIAS, "actual_length": len(value)}
            raise PydanticKnownError("too_long", ctx)
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            # ASCII digits only: str.isdigit() also accepts "²" and Arabic-Indic digits, which int() refuses
            # or reads as another token.
            if not TOKEN_ID.fullmatch(key):
                raise ValueError(f"keys must be token ids (at most {TOKEN_ID_DIGITS} ASCII digits), got {key[:20]!r}")
        return value


class CompletionRequest(OpenAISampling):
    """The OpenAI completions API, plus `top_k`, `repetition_penalty` and `ignore_eos` (as vLLM)."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                requires({"max_tokens": {"const": 0}}, {"echo": {"const": True}}),
                CHOICES_RULE,
            ],
            "examples": [
                {"model": "generator", "prompt": "In the beginning", "max_tokens": 16, "temperature": 0.8, "seed": 42}
            ],
        }
    )

    model: str
    prompt: NonEmptyText | Annotated[list[NonEmptyText], bounded()] | TokenIds | Annotated[list[TokenIds], bounded()]
    suffix: None = Field(None, description="not supported (must be null)")
    max_tokens: int | None = Field(
        16, ge=0, description="0 with echo: score the prompt only; beyond the context: clamped (finish 'length')"
    )
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=16, description="only best_of == n is supported")

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise FieldError("best_of", f"only best_of == n ({self.n}) is supported, got {self.best_of}")
        if self.max_tokens == 0 and not self.echo:
            raise FieldError("max_tokens", "0 is only meaningful with echo (scoring the prompt)")
        return self


class CompletionLogprobs(Response):
    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="with echo, the first prompt token's is null")
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(Response):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length", "error"] | None


class OpenAIResponse(Response):
    """What every OpenAI answer body starts with; `object` names the kind of answer."""

    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str | None = None


class CompletionResponse(OpenAIResponse):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None
