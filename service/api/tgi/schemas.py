"""TGI's request body: `{inputs, parameters, stream}` (text-generation-inference's shape)."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, field_validator

from service.api.native.schemas import MAX_SEED, MAX_TOP_K, Lenient, NonEmptyText, bounded
from service.api.structured import TgiGrammar

FINISH = {"eos": "eos_token", "stop": "stop_sequence", "length": "length", "error": "error"}
MAX_STOP = 4


class TgiParameters(Lenient):
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, gt=0.0, le=10.0)
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K, description="beyond the vocabulary: all")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    do_sample: bool = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Annotated[list[NonEmptyText], bounded(MAX_STOP, None)] = Field(default_factory=list)
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    top_n_tokens: int | None = Field(None, ge=0, le=5)
    truncate: int | None = Field(None, ge=1, description="keep only the last `truncate` prompt tokens")
    # Accepted only at their neutral values:
    best_of: int | None = Field(None, ge=1, le=1)
    typical_p: float | None = Field(None, ge=1.0, le=1.0, description="typical decoding is not supported")
    # bool, not Literal[False]: a literal compares by equality and would take 0 for false.
    watermark: bool = Field(False, json_schema_extra={"const": False}, description="not supported: false only")
    grammar: TgiGrammar | None = Field(None, description='`{"type": "json" | "regex", "value": ...}`')
    adapter_id: None = None

    @field_validator("watermark")
    @classmethod
    def _no_watermark(cls, value: bool) -> bool:
        if value:
            raise ValueError("watermarking is not supported")
        return value


class TgiRequest(Lenient):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"inputs": "In the beginning", "parameters": {"max_new_tokens": 16, "do_sample": True, "seed": 42}}
            ]
        }
    )

    inputs: NonEmptyText
    parameters: TgiParameters = Field(default_factory=lambda: TgiParameters())
    stream: bool = False


# The engine's option names as the client sent them, so that errors name the client's field.
TGI_FIELDS = {name: f"parameters.{name}" for name in TgiParameters.model_fields}
