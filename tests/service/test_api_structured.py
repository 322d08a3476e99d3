"""Structured outputs through the server: a random-weight model constrained by a JSON schema, a regex, a list of
choices or a grammar writes output that matches, every time, in every decoding mode (greedy, seeded sampling,
n > 1, streamed), with rows with and without constraints in one batch; each protocol's spelling reaches the
same constraint, and what cannot be compiled is a 422 naming the field."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.service.test_api_chat import assert_openai_error, chunks

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "Describe a person as JSON."}]
_STRING = {"type": "string", "maxLength": 12}
SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {"type": "object"},
    "flat": {"type": "object", "properties": {"name": _STRING, "age": {"type": "integer"}},
             "required": ["name", "age"], "additionalProperties": False},
    "optional fields": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
                        "additionalProperties": False},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    "const": {"type": "object", "properties": {"kind": {"const": "person"}}, "required": ["kind"]},
    "array of strings": {"type": "array", "items": _STRING, "minItems": 1, "maxItems": 4},
    "array of objects": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                                                    "required": ["id"], "additionalProperties": False},
                         "maxItems": 3},
    "nested": {"type": "object", "properties": {"address": {
        "type": "object", "properties": {"city": _STRING, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city", "zip"], "additionalProperties": False}}, "required": ["address"]},
    "deeply nested": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "array", "items": {"type": "number"}, "maxItems": 2}},
        "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
                "required": ["code"]},
    "bounded numbers": {"type": "object", "properties": {
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["score", "ratio"]},
    "boolean and null": {"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}},
                         "required": ["ok", "none"]},
    "any of": {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, _STRING]}}, "required": ["v"]},
    "one of objects": {"oneOf": [
        {"type": "object", "properties": {"cat": _STRING}, "required": ["cat"], "additionalProperties": False},
        {"type": "object", "properties": {"dog": {"type": "integer"}}, "required": ["dog"],
         "additionalProperties": False}]},
    "refs": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                                 "required": ["x", "y"], "additionalProperties": False}},
             "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
             "required": ["from", "to"]},
    "string formats": {"type": "object", "properties": {"day": {"type": "string", "format": "date"}},
                       "required": ["day"]},
    "enum of numbers": {"type": "object", "properties": {"n": {"enum": [1, 2.5, -3]}}, "required": ["n"]},
    "unbounded string": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "many required": {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"},
                      "required": list("abcdef"), "additionalProperties": False},
    "array of arrays": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                        "minItems": 2, "maxItems": 2},
    "top-level string": {"type": "string", "enum": ["yes", "no", "maybe"]},
    "additional properties typed": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
}
MODES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0},
    "sampled": {"temperature": 1.0, "seed": 7},
    "top-k top-p": {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 11},
}


@pytest.fixture
async def chat(serving: Callable[..., AbstractAsyncContextManager[Any]], chat_artifacts: Path) -> AsyncIterator[Any]:
    async with serving(artifacts_dir=chat_artifacts, models="chat,generator", max_new_tokens=96) as s:
        yield s


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


DATE = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")  # RFC 3339's full-date (year 0000 too)
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("date")(lambda value: not isinstance(value, str) or DATE.fullmatch(value) is not None)


def check(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


def valid(text: str, schema: dict[str, Any]) -> bool:
    check(text, schema)  # raises, naming what is wrong
    return True


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_every_schema_gives_valid_json_in_every_mode(chat: Any, mode: str) -> None:
    async def one(name: str) -> None:
        body = {"model": "chat", "messages": USER, "max_tokens": 96, "n": 2,
                "response_format": schema_format(SCHEMAS[name]), **MODES[mode]}
        r = await chat.client.post(CHAT, json=body)
        assert r.status_code == 200, (name, r.text)
        for choice in r.json()["choices"]:
            check(choice["message"]["content"], SCHEMAS[name])

    await asyncio.gather(*(one(name) for name in SCHEMAS))  # many schemas in one batch


async def test_streamed_output_is_the_same_valid_json(chat: Any) -> None:
    schema = SCHEMAS["nested"]
    body = {"model": "chat", "messages": USER, "max_tokens": 96, "temperature": 0.9, "seed": 5,
            "response_format": schema_format(schema)}
    whole = (await chat.client.post(CHAT, json=body)).json()["choices"][0]["message"]["content"]
    r = await chat.client.post(CHAT, json={**body, "stream": True})
    events = [c for c in chunks(r.content) if isinstance(c, dict) and c["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events)
    assert text == whole
    check(text, schema)


async def test_constrained_and_free_rows_share_a_batch_and_free_rows_are_unchanged(chat: Any) -> None:
    free = {"model": "chat", "messages": USER, "max_tokens": 24, "temperature": 0}
    alone = (await chat.client.post(CHAT, json=free)).json()["choices"][0]["message"]["content"]
    constrained = {**free, "max_tokens": 64, "response_format": schema_format(SCHEMAS["flat"])}
    answers = await asyncio.gather(*[chat.client.post(CHAT, json=b) for b in [free, constrained] * 4])
    for i, r in enumerate(answers):
        content = r.json()["choices"][0]["message"]["content"]
        if i % 2:
            check(content, SCHEMAS["flat"])
        else:
            assert content == alone


async def test_json_object_regex_choice_and_grammar(chat: Any) -> None:
    base = {"model": "chat", "messages": USER, "max_tokens": 48, "temperature": 1.0, "seed": 3}
    cases: list[tuple[dict[str, Any], Callable[[str], bool]]] = [
        ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
        ({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2,5}"}},
         lambda t: re.fullmatch("[0-9]{3}-[a-z]{2,5}", t) is not None),
        ({"structured_outputs": {"choice": ["positive", "negative"]}}, lambda t: t in ("positive", "negative")),
        ({"structured_outputs": {"json": json.dumps(SCHEMAS["enum"])}}, lambda t: json.loads(t)["color"] in
         ("red", "green", "blue")),
        ({"structured_outputs": {"grammar": 'start: "yes" | "no" | "n/a"'}}, lambda t: t in ("yes", "no", "n/a")),
        ({"guided_choice": ["a", "b"]}, lambda t: t in ("a", "b")),
        ({"guided_regex": "(true|false)"}, lambda t: t in ("true", "false")),
        ({"guided_json": SCHEMAS["flat"]}, lambda t: valid(t, SCHEMAS["flat"])),
    ]
    for extra, ok in cases:
        for path, body in ((CHAT, {**base, **extra}),
                           (COMPLETIONS, {**{k: v for k, v in base.items() if k != "messages"}, **extra,
                                          "prompt": "Answer:", "model": "generator"})):
            r = await chat.client.post(path, json=body)
            assert r.status_code == 200, (extra, r.text)
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if path == CHAT else choice["text"]
            assert ok(text), (path, extra, text)


async def test_tgi_grammar_on_generate(chat: Any) -> None:
    schema = SCHEMAS["bounded numbers"]
    for grammar, ok in (({"type": "json", "value": schema}, lambda t: valid(t, schema)),
                        ({"type": "regex", "value": "[A-Z][a-z]{1,8}"}, lambda t: re.fullmatch("[A-Z][a-z]{1,8}", t))):
        body = {"inputs": "Answer:", "parameters": {"max_new_tokens": 48, "grammar": grammar, "do_sample": True,
                                                    "seed": 1}}
        r = await chat.client.post("/models/generator/generate", json=body)
        if r.status_code == 404:
            r = await chat.client.post("/generate", json={**body, "model": "generator"})
        assert r.status_code == 200, r.text
        assert ok(r.json()["generated_text"])


async def test_a_budget_too_short_for_the_structure_still_closes_it_and_says_length(chat: Any) -> None:
    schema = SCHEMAS["unbounded string"]
    body = {"model": "chat", "messages": USER, "max_tokens": 12, "temperature": 0,
            "response_format": schema_format(schema)}
    choice = (await chat.client.post(CHAT, json=body)).json()["choices"][0]
    check(choice["message"]["content"], schema)


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
         "response_format.json_schema.schema", ["json constraint cannot be used"]),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "contentEncoding": "base64", "x-unknown": 1, "if": {}}}}},
         "response_format.json_schema.schema", ["cannot be used"]),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", ["regex constraint"]),
        ({"structured_outputs": {"grammar": "start: ???"}}, "structured_outputs.grammar", ["grammar constraint"]),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice", ["one constraint"]),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", ["one constraint"]),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", ["not a JSON schema"]),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", ["Extra inputs"]),
        ({"response_format": {"type": "xml"}}, "response_format.type", []),
    ],
)
async def test_constraints_that_cannot_be_used_are_422_naming_the_field(
    chat: Any, extra: dict[str, Any], param: str, words: list[str]
) -> None:
    r = await chat.client.post(CHAT, json={"model": "chat", "messages": USER, "max_tokens": 8, **extra})
    assert_openai_error(r, 422, param, *words)


async def test_a_compiled_schema_is_reused(chat: Any) -> None:
    grammars = chat.engine.services["chat"].model.grammars
    body = {"model": "chat", "messages": USER, "max_tokens": 8, "response_format": schema_format(SCHEMAS["refs"])}
    for _ in range(2):
        assert (await chat.client.post(CHAT, json=body)).status_code == 200
    assert len([k for k in grammars._compiled if '"from"' in k]) == 1


@pytest.mark.parametrize(
    ("grammar", "field"),
    [
        ({"type": "json_object", "value": ""}, "parameters.grammar.value"),
        ({"type": "json", "value": "[1,"}, "parameters.grammar.value"),
        ({"type": "regex", "value": {"a": 1}}, "parameters.grammar.value"),
        ({"type": "json", "value": {"type": "frobnicate"}}, "parameters.grammar.value"),
        ({"type": "xml", "value": "x"}, "parameters.grammar.type"),
    ],
)
async def test_tgi_grammars_that_cannot_be_used_are_422(chat: Any, grammar: dict[str, Any], field: str) -> None:
    body = {"inputs": "Answer:", "parameters": {"max_new_tokens": 4, "grammar": grammar}}
    r = await chat.client.post("/generate", json={**body, "model": "generator"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field, r.text


async def test_store_and_metadata_are_accepted_and_ignored(chat: Any) -> None:
    body = {"model": "chat", "messages": USER, "max_tokens": 4, "temperature": 0}
    plain = (await chat.client.post(CHAT, json=body)).json()["choices"][0]["message"]["content"]
    r = await chat.client.post(CHAT, json={**body, "store": True, "metadata": {"run": "7"}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain
