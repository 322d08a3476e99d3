"""Structured outputs: the request fields that constrain what a generator may write, in each protocol's
spelling, mapped onto one engine `Constraint` (service/engine/tasks/generation/constraints.py):

- OpenAI's `response_format`: `{"type": "json_object"}`, `{"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}` (and TGI's chat spelling, `{"type": "json_object" | "json", "value": schema}`);
- vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) and its older
  `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`;
- TGI's `grammar` parameter (`{"type": "json" | "regex", "value": ...}`).

A request may ask in one of these ways at a time; what llguidance cannot compile is a 422 naming the field."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.api.errors import FieldError
from service.api.native.schemas import Request, bounded
from service.engine.tasks.generation.constraints import Constraint, Kind

MAX_CHOICES = 1024
OTHER_KINDS: dict[str, Kind] = {"regex": "regex", "choice": "choice", "grammar": "grammar"}
# vLLM's options that change how a grammar is built; this server builds compact JSON (no free whitespace)
# with llguidance and has no other backend, so they are accepted and have no effect.
IGNORED_OPTIONS = ("disable_fallback", "disable_any_whitespace", "whitespace_pattern", "guided_decoding_backend")


GUIDED_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def _schema(value: dict[str, Any] | str, field: str) -> dict[str, Any] | bool:
    """A JSON schema given as an object or as JSON text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise FieldError(field, f"not a JSON schema: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise FieldError(field, "a JSON schema is an object")
    return value


class JsonSchemaFormat(Request):
    name: str = Field("response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="absent: any JSON object")
    strict: bool | None = None

    model_config = ConfigDict(populate_by_name=True)


class ResponseFormat(Request):
    """OpenAI's `response_format`; `value` is TGI's spelling of the schema."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [{"if": {"properties": {"type": {"const": "json_schema"}}},
                       "then": {"properties": {"json_schema": {"type": "object"}}, "required": ["json_schema"]}}]
        }
    )  # fmt: skip

    type: Literal["text", "json_object", "json_schema", "json"]
    json_schema: JsonSchemaFormat | None = None
    value: dict[str, Any] | None = Field(None, description="TGI: the JSON schema of json_object / json")

    def constraint(self, field: str) -> Constraint | None:
        if self.type == "text":
            return None
        if self.type == "json_schema":
            if self.json_schema is None:
                raise FieldError(f"{field}.json_schema", "json_schema needs its json_schema object")
            schema = self.json_schema.schema_ if self.json_schema.schema_ is not None else {"type": "object"}
            return Constraint("json", schema, f"{field}.json_schema.schema")
        if self.value is not None:
            return Constraint("json", self.value, f"{field}.value")
        return Constraint("json", {"type": "object"}, field)


class StructuredOutputs(Request):
    """vLLM's `structured_outputs`: exactly one of the constraints."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], bounded(MAX_CHOICES)] | None = None
    grammar: str | None = Field(None, description="a Lark grammar (llguidance's dialect)")
    json_object: bool | None = None
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None

    model_config = ConfigDict(populate_by_name=True)

    def constraint(self, field: str) -> Constraint | None:
        given = [name for name in ("json_", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) > 1:
            names = [name.rstrip("_") for name in given]
            raise FieldError(f"{field}.{names[1]}", f"one constraint at a time, not {' and '.join(names)}")
        if not given:
            return None
        name = given[0]
        if name == "json_":
            schema = _schema(self.json_ if self.json_ is not None else {}, f"{field}.json")
            if self.disable_additional_properties and isinstance(schema, dict):
                schema = {**schema, "additionalProperties": False}
            return Constraint("json", schema, f"{field}.json")
        if name == "json_object":
            return Constraint("json", {"type": "object"}, f"{field}.json_object")
        return Constraint(OTHER_KINDS[name], getattr(self, name), f"{field}.{name}")


class TgiGrammar(BaseModel):
    """TGI's `grammar` parameter."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "allOf": [{"if": {"properties": {"type": {"const": "regex"}}},
                       "then": {"properties": {"value": {"type": "string"}}}}]
        },
    )  # fmt: skip

    type: Literal["json", "regex", "json_object"]
    value: dict[str, Any] | str

    @model_validator(mode="after")
    def _usable(self) -> TgiGrammar:
        self.constraint("")  # a value of the wrong kind is a 422 now, not when the job is built
        return self

    def constraint(self, field: str) -> Constraint:
        where = f"{field}.value" if field else "value"  # relative to the grammar while it is validated
        if self.type == "regex":
            if not isinstance(self.value, str):
                raise FieldError(where, "a regex grammar's value is a string")
            return Constraint("regex", self.value, where)
        return Constraint("json", _schema(self.value, where), where)


class StructuredFields(Request):
    """The structured-output fields OpenAI's completions and chat completions share (vLLM's spellings)."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], bounded(MAX_CHOICES)] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored (llguidance is the backend)")

    @model_validator(mode="after")
    def _one_way(self) -> StructuredFields:
        self.constraint()  # two ways of asking at once is a 422 now, not when the job is built
        return self

    def constraint(self) -> Constraint | None:
        asking = [f for f in GUIDED_FIELDS if getattr(self, f) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            asking.insert(0, "response_format")
        if len(asking) > 1:
            raise FieldError(asking[1], f"one constraint at a time: {asking[0]} asks for one already")
        found: list[Constraint] = []
        if self.response_format is not None and (c := self.response_format.constraint("response_format")):
            found.append(c)
        if self.structured_outputs is not None and (c := self.structured_outputs.constraint("structured_outputs")):
            found.append(c)
        if self.guided_json is not None:
            found.append(Constraint("json", _schema(self.guided_json, "guided_json"), "guided_json"))
        guided = {"regex": self.guided_regex, "choice": self.guided_choice, "grammar": self.guided_grammar}
        for name, value in guided.items():
            if value is not None:
                found.append(Constraint(OTHER_KINDS[name], value, f"guided_{name}"))
        if len(found) > 1:
            raise FieldError(found[1].field, f"one constraint at a time: {found[0].field} asks for one already")
        return found[0] if found else None
