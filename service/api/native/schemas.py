"""Request and response bodies. Requests are strict (no type coercion) and reject unknown fields."""

from __future__ import annotations

import re
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from service.api.errors import MAX_ERRORS, FieldError
from service.api.json_numbers import integral_floats_as_ints
from service.engine.tasks.translation.request import DEFAULT_BEAMS, MAX_BEAMS

MAX_SEED = 2**53 - 1  # the largest integer a JavaScript number holds exactly (Number.MAX_SAFE_INTEGER)
# top_k beyond the vocabulary keeps every token; the bound keeps it a machine integer (int64 in the chooser).
MAX_TOP_K = 2**31 - 1
MAX_LOGIT_BIAS = 300  # entries, as OpenAI
TOKEN_ID_DIGITS = 9
TOKEN_ID = re.compile(rf"[0-9]{{1,{TOKEN_ID_DIGITS}}}", re.ASCII)
NonEmptyText = Annotated[str, Field(min_length=1)]
# Not whitespace alone: a character outside Python's str.isspace() set (the engine refuses a text that
# strip() empties). Stated in the document only; the engine's check stays the one that answers.
NOT_BLANK = r"[^\t-\r\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
Text = Annotated[str, Field(min_length=1, json_schema_extra={"pattern": NOT_BLANK})]
# Items in one request's list of texts, prompts or messages, whatever SERVE_MAX_QUEUE_SIZE says (the engine's
# per-request limit, 256 by default): OpenAI's limit on embedding inputs.
MAX_ITEMS = 2048
MAX_EMBEDDING_INPUTS = MAX_ITEMS  # inputs in one embedding request (OpenAI's limit; TEI's max_client_batch_size)


def bounded(max_length: int | None = MAX_ITEMS, min_length: int | None = 1) -> Any:
    """The Field of a request's list: its length bounded (checked before its items) and its items checked up
    to the first wrong one (`fail_fast`), so that a list of 100,000 wrong items is one error, not 100,000."""
    return Field(min_length=min_length, max_length=max_length, fail_fast=True)


# Token ids: as many as the body holds (the engine refuses more than the model's context, SERVE_MAX_TOKENIZE_TOKENS
# on /detokenize); a wrong one stops the check.
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], bounded(None)]
# OpenAI's `input` and TEI's `inputs`: a text, a list of texts, token ids, or a list of token-id lists.
EmbeddingInputs = (
    Text
    | Annotated[list[Text], bounded(MAX_EMBEDDING_INPUTS)]
    | TokenIds
    | Annotated[list[TokenIds], bounded(MAX_EMBEDDING_INPUTS)]
)
ModelName = Annotated[
    str | None,
    Field(None, description="a loaded model of this task (GET /v1/models); default: the task's first in SERVE_MODELS"),
]
Pair = Annotated[list[Text], Field(min_length=2, max_length=2, fail_fast=True, description="[text_a, text_b]")]
StopStrings = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], bounded(16, None)]


def requires(condition: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema `if`/`then` over properties, so the OpenAPI document states the rules the server checks."""
    return {
        "if": {"properties": condition, "required": list(condition)},
        "then": {"properties": then, "required": list(then)},
    }


# True while a body that was parsed with its integral floats read as ints is validated (a large one:
# service/api/asgi/lean_route.py): the models' own walk to the same end is skipped, ~40 ms on a megabyte of
# nested lists, which the Inference API's routes would spend on the event loop.
FLOATS_READ_AS_INTS: ContextVar[bool] = ContextVar("floats_read_as_ints", default=False)


def json_number(text: str) -> int | float:
    """A JSON number with a fraction or an exponent, as `integral_floats_as_ints` leaves it (json.loads'
    `parse_float`)."""
    number = float(text)
    return int(number) if number.is_integer() else number


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integral_floats(cls, data: Any) -> Any:
        if cls.model_config.get("extra") == "forbid":
            refuse_many_unknown(cls, data)
        return data if FLOATS_READ_AS_INTS.get() else integral_floats_as_ints(data)  # 1.0 is an integer


class Lenient(BaseModel):
    """The Hugging Face protocols' bodies (TGI, TEI, the Inference API): unknown fields are ignored, as those
    servers do; types are still checked strictly."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integral_floats(cls, data: Any) -> Any:
        if type(data) is dict and len(data) > len(cls.model_fields) + MAX_ERRORS:  # not walked: ignored anyway
            data = {name: data[name] for name in cls.model_fields if name in data}
        return data if FLOATS_READ_AS_INTS.get() else integral_floats_as_ints(data)


def refuse_many_unknown(model: type[BaseModel], data: Any) -> None:
    """More unknown fields than a 422 lists: refused at once, naming the first (each would be an error of
    its own: a 1 MB body holds ~90,000)."""
    if type(data) is dict and len(data) > len(model.model_fields) + MAX_ERRORS:
        unknown = data.keys() - model.model_fields.keys()
        if len(unknown) > MAX_ERRORS:
            first = next(name for name in data if name in unknown)
            raise FieldError(first, f"Extra inputs are not permitted ({len(unknown):,} unknown fields)")


def validated(model: type[BaseModel], payload: Any, names: dict[str, str] | None = None) -> Any:
    """Validate a body that was read as plain JSON (the dispatch routes) with the project's 422 shape; `names`
    renames the fields of a body built from the client's ("text" -> "inputs")."""
    try:
        return TypeAdapter(model).validate_python(payload)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *_loc_as_sent(e["loc"], names or {}))} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def _loc_as_sent(loc: tuple[int | str, ...], names: dict[str, str]) -> tuple[int | str, ...]:
    if loc and isinstance(loc[0], str) and loc[0] in names:
        return (*names[loc[0]].split("."), *loc[1:])
    return loc


# Which end of an encoder input past the model's limit `truncate` cuts. TEI writes "Left"/"Right", the
# Inference API spec and huggingface_hub "left"/"right": the Hugging Face routes take both.
TruncationSide = Literal["right", "left"]
AnyCaseTruncationSide = Literal["right", "left", "Right", "Left"]
# OpenAI's, TEI's and the Inference API's embedding requests take it alike.
Dimensions = Annotated[int | None, Field(ge=1, description="keep the first n dimensions (models trained for it)")]
TRUNCATE_DOC = "cut an input past the model's limit (from `truncation_direction`) instead of a 422"


def truncation_side(value: str) -> TruncationSide:
    return "left" if value.lower() == "left" else "right"


class Response(BaseModel):
    pass


class Usage(Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ErrorDetail(Response):
    type: str = Field(description="machine-readable kind, e.g. validation_error, queue_full")
    message: str
    field: str | None = Field(None, description="the request field at fault, e.g. text[2]")


class ErrorResponse(Response):
    error: ErrorDetail


# --- translation ---------------------------------------------------------------------------------


class TranslateRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                requires({"stream": {"const": True}}, {"num_beams": {"const": 1}}),
                requires({"stream": {"const": True}}, {"text": {"not": {"type": "array", "minItems": 2}}}),
                requires({"do_sample": {"const": True}}, {"num_beams": {"const": 1}}),
                requires({"repetition_penalty": {"not": {"const": 1}}}, {"num_beams": {"const": 1}}),
                requires(
                    {"stop": {"not": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}}},
                    {"num_beams": {"const": 1}},
                ),
            ],
            "examples": [{"text": "The Lord is my shepherd.", "model": "translator", "num_beams": 4, "n_best": 2}],
        }
    )

    text: Text | Annotated[list[Text], bounded()] = Field(description="one source text, or a list of them")
    model: ModelName
    num_beams: int = Field(DEFAULT_BEAMS, ge=1, le=MAX_BEAMS, description="1 = greedy; beams are batch rows")
    n_best: int = Field(1, ge=1, le=16, description="hypotheses returned per text (<= num_beams)")
    length_penalty: float = Field(1.0, ge=0.0, le=10.0, description="score = logprob / length ** length_penalty")
    max_new_tokens: int | None = Field(None, ge=1, description="default: 2 * source tokens + 16, within the server cap")
    no_repeat_ngram_size: int = Field(
        3,
        ge=0,
        le=16,
        description="no n-gram of this many tokens occurs twice in an output (0 = off); the model card measures 3",
    )
    do_sample: bool = Field(False, description="sample instead of searching (num_beams must be 1)")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="with do_sample")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="with do_sample; 0 = off; beyond the vocabulary: all")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="with do_sample")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="with do_sample")
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=10.0, description="1 = off; on the tokens translated so far (num_beams must be 1)"
    )
    stop: NonEmptyText | StopStrings | None = Field(
        None, description="the translation ends before any of these strings (num_beams must be 1)"
    )
    return_attention: bool = Field(False, description="encoder, decoder and cross attention of the best hypothesis")
    stream: bool = Field(
        False, description="Server-Sent Events: one `token` event per target token, then `done` (one text, num_beams=1)"
    )
    source_lang: str | None = Field(
        None,
        max_length=32,
        description="a multilingual model's (M2M100, NLLB) source language code, e.g. `en` or `eng_Latn`; "
        "default: its tokenizer's",
    )
    target_lang: str | None = Field(
        None,
        max_length=32,
        description="a multilingual model's target language code, forced as the first token; default: the "
        "checkpoint's forced_bos_token_id, else required",
    )

    @model_validator(mode="after")
    def _n_best(self) -> TranslateRequest:
        if self.n_best > self.num_beams:
            raise FieldError("n_best", f"must be <= num_beams ({self.num_beams}), got {self.n_best}")
        return self


class TranslationHypothesis(Response):
    text: str
    score: float = Field(description="length-normalized log-probability")
    output_tokens: int


class Translation(Response):
    text: str = Field(description="the best hypothesis")
    score: float
    input_tokens: int
    output_tokens: int
    n_best: list[TranslationHypothesis] | None = Field(None, description="present when n_best > 1, best first")
    attention: dict[str, Any] | None = None


class TranslateResponse(Response):
    model: str
    translations: list[Translation]


# --- generation ----------------------------------------------------------------------------------


class GenerateRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [requires({"top_logprobs": {"exclusiveMinimum": 0}}, {"logprobs": {"const": True}})],
            "examples": [
                {
                    "prompt": "In the beginning",
                    "model": "generator",
                    "max_new_tokens": 16,
                    "temperature": 0.8,
                    "seed": 42,
                }
            ],
        }
    )

    prompt: NonEmptyText | TokenIds = Field(description="text, or token ids")
    model: ModelName
    max_new_tokens: int | None = Field(None, ge=1, description="default 64, within the server cap and the context")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 = greedy")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="0 = off; beyond the vocabulary: all")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, description="1 = off")
    stop: NonEmptyText | StopStrings | None = Field(None, description="stop before any of these strings")
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="the same random numbers alone or batched (docs/api.md, Generate)"
    )
    ignore_eos: bool = False
    stream: bool = Field(False, description="Server-Sent Events: one `token` event per token, then `done`")
    logprobs: bool = Field(False, description="return each token's log-probability")
    top_logprobs: int = Field(0, ge=0, le=20, description="with logprobs: the most likely alternatives per token")
    return_attention: bool = Field(False, description="self-attention over prompt and output, per layer and head")

    @model_validator(mode="after")
    def _top_logprobs(self) -> GenerateRequest:
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "needs logprobs=true")
        return self


class TopLogprob(Response):
    id: int
    text: str
    logprob: float


class GeneratedToken(Response):
    id: int
    text: str = Field(description="text released with this token ('' while a character is incomplete)")
    special: bool
    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None


class GenerateResponse(Response):
    model: str
    text: str
    finish_reason: Literal["eos", "stop", "length", "error"]
    usage: Usage
    seed: int
    tokens: list[GeneratedToken] | None = Field(None, description="present when logprobs=true")
    attention: dict[str, Any] | None = None


# --- classification ------------------------------------------------------------------------------


class ClassifyRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"text": ["A wonderful, moving film.", "A dull story."], "model": "classifier-minilm", "top_k": 2}
            ]
        }
    )

    text: Text | Annotated[list[Text | Pair], bounded()] = Field(
        description='one text, a list of texts, or sentence pairs: [["premise", "hypothesis"], ...]'
    )
    model: ModelName
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K, description="also list the k most likely labels")
    return_attention: bool = Field(False, description="self-attention per layer and head")
    truncate: bool = Field(False, description=TRUNCATE_DOC)
    truncation_direction: TruncationSide = Field("right", description="which end `truncate` cuts")


class LabelScore(Response):
    label: str
    score: float


class ClassificationResult(Response):
    label: str
    score: float
    scores: dict[str, float] = Field(description="every label's probability (one label: its sigmoid)")
    logits: list[float] = Field(description="the raw scores, in label order")
    top_k: list[LabelScore] | None = None
    input_tokens: int
    attention: dict[str, Any] | None = None


class ClassifyResponse(Response):
    model: str
    results: list[ClassificationResult]


# --- models and health ---------------------------------------------------------------------------


class ModelCard(Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "transformer-serving"
    task: str
    summary: str = Field(
        description="one line from the model card: what the model is for and the domains it was trained on "
        "(the card's intended_use and domains); present with SERVE_MODEL_DETAILS=false too"
    )
    default: bool = Field(description="answers the requests of its task that name no model")
    architecture: str
    dims: dict[str, int]
    vocab_size: int
    max_positions: int
    labels: list[str] | None = None
    provider: dict[str, str] = Field(description="execution provider really in use, per graph")
    quantization: dict[str, str] = Field(description="none or int8, per graph")
    metrics: dict[str, Any] = Field(description="from the model card")
    card: dict[str, Any] | None = Field(
        None, description="the whole model card; left out with SERVE_MODEL_DETAILS=false"
    )


class ModelList(Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Status(Response):
    status: str
    detail: str | None = None
