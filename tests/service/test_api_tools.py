"""Tool calling on POST /v1/chat/completions, on the tiny random chat import served with a Hermes-style template
(`<tool_call>` blocks) and with its own ChatML one (Llama 3 JSON calls): `tool_choice` `required` and a named
function always give calls whose arguments validate against the function's parameters (greedy, sampled, n > 1,
streamed); what the model writes is parsed into `tool_calls`; the template gets the tools and the tool messages
as apply_chat_template does. The tiny model's context is 128 tokens, so the served template names the tools
only and the tools are small; Qwen2.5's whole template is compared with transformers without a model."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest

from service.api.openai.tool_calls import FORMATS, HermesFormat, Llama3JsonFormat, ParsedCall, ToolStream, tool_format
from service.engine.tasks.generation.chat_template import ChatTemplate
from service.runtime.chat_template_spec import ChatTemplateSpec
from tests.chat_templates import CHATML, HERMES_TOOLS, LLAMA3
from tests.service.test_api_chat import assert_openai_error, chunks

PATH = "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "w", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"c": {"type": "string", "maxLength": 4}, "u": {"enum": ["C", "F"]}},
        "required": ["c", "u"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": -9, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "nop", "description": "Takes nothing"}},
    {"type": "function", "function": {"name": "tag", "parameters": {
        "$defs": {"item": {"type": "object", "properties": {"i": {"type": "integer", "minimum": 0, "maximum": 9}},
                           "required": ["i"], "additionalProperties": False}},
        "type": "object", "properties": {"t": {"type": "array", "items": {"$ref": "#/$defs/item"},
                                               "minItems": 1, "maxItems": 2}},
        "required": ["t"], "additionalProperties": False}}},
]
# Hermes style in few tokens: the tools by name, an assistant's calls as <tool_call> blocks (the arguments
# as JSON), a tool's answer in a tool turn.
COMPACT_HERMES = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- for tool in tools %}{{- tool.function.name + ';' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}{{- '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}{{- '<tool_call>' + {'name': call.function.name, "
    "'arguments': call.function.arguments} | tojson + '</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "maxProperties": 0})
              for t in TOOLS}
MODES: dict[str, dict[str, Any]] = {"greedy": {"temperature": 0}, "sampled": {"temperature": 1.0, "seed": 7}}
CALLS = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"b": 2}'}}]
CONVERSATION = [*USER, {"role": "assistant", "content": None, "tool_calls": CALLS},
                {"role": "tool", "tool_call_id": "call_1", "content": "18"}]
# The same as transformers takes it: the arguments as an object, no null content.
AS_TRANSFORMERS = [*USER, {"role": "assistant", "content": "", "tool_calls": [
    {**CALLS[0], "function": {"name": "add", "arguments": {"b": 2}}}]}, CONVERSATION[2]]
CHOICES: dict[str, Any] = {
    "required": "required",
    **{name: {"type": "function", "function": {"name": name}} for name in PARAMETERS},
}


def served_with(template: str) -> Callable[..., Any]:
    @asynccontextmanager
    async def serve(serving: Callable[..., AbstractAsyncContextManager[Any]], chat_artifacts: Path,
                    folder: Path) -> AsyncIterator[Any]:
        shutil.copytree(chat_artifacts / "chat", folder / "chat")
        (folder / "chat" / "chat_template.jinja").write_text(template)
        async with serving(artifacts_dir=folder, models="chat", max_new_tokens=96) as s:
            yield s

    return serve


@pytest.fixture
async def hermes(serving: Any, chat_artifacts: Path, tmp_path: Path) -> AsyncIterator[Any]:
    async with served_with(COMPACT_HERMES)(serving, chat_artifacts, tmp_path) as s:
        yield s


@pytest.fixture
async def llama3(serving: Any, chat_artifacts: Path) -> AsyncIterator[Any]:
    """The chat import as imported: a ChatML template, which writes no <tool_call>, so Llama 3 JSON calls."""
    async with serving(artifacts_dir=chat_artifacts, models="chat", max_new_tokens=96) as s:
        yield s


def check_calls(calls: list[dict[str, Any]], names: list[str]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in names, call
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]])


def called(choice: str) -> list[str]:
    return list(PARAMETERS) if choice == "required" else [choice]


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_required_and_named_calls_always_validate(hermes: Any, mode: str) -> None:
    """One call each (a named function, or required without parallel calls): complete, and nothing else."""
    for choice, tool_choice in CHOICES.items():
        body = {"model": "chat", "messages": USER, "tools": TOOLS, "tool_choice": tool_choice, "n": 2,
                "max_tokens": 96, "parallel_tool_calls": False, **MODES[mode]}
        r = await hermes.client.post(PATH, json=body)
        assert r.status_code == 200, (choice, r.text)
        for c in r.json()["choices"]:
            assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, c
            check_calls(c["message"]["tool_calls"], called(choice))
            assert len(c["message"]["tool_calls"]) == 1


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_required_parallel_calls_validate(hermes: Any, mode: str) -> None:
    """One call or more, every one whole: a row whose budget leaves no room for another call ends after the
    calls it has (finish length where the budget decided it)."""
    body = {"model": "chat", "messages": USER, "tools": TOOLS, "tool_choice": "required", "n": 4, "max_tokens": 96,
            "seed": 1, **MODES[mode]}
    r = await hermes.client.post(PATH, json=body)
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        check_calls(c["message"]["tool_calls"], list(PARAMETERS))
        assert c["message"]["tool_calls"] and c["message"]["content"] is None, c
        assert c["finish_reason"] in ("tool_calls", "length"), c


def streamed_calls(events: list[Any], n: int) -> tuple[list[list[dict[str, Any]]], list[str | None]]:
    """Each choice's calls put together as OpenAI's SDK does (by index, arguments appended), and its finish."""
    calls: list[dict[int, dict[str, Any]]] = [{} for _ in range(n)]
    finish: list[str | None] = [None] * n
    for event in events:
        for choice in event["choices"]:
            for delta in choice["delta"].get("tool_calls", []):
                call = calls[choice["index"]].setdefault(delta["index"], {"function": {"arguments": ""}})
                call.update({k: delta[k] for k in ("id", "type") if delta.get(k)})
                call["function"]["name"] = delta["function"].get("name") or call["function"].get("name")
                call["function"]["arguments"] += delta["function"].get("arguments", "")
            finish[choice["index"]] = choice["finish_reason"] or finish[choice["index"]]
    return [[c[i] for i in sorted(c)] for c in calls], finish


@pytest.mark.parametrize("choice", ["required", "add"])
async def test_streamed_calls_are_the_whole_responses_calls(hermes: Any, choice: str) -> None:
    body = {"model": "chat", "messages": USER, "tools": TOOLS, "tool_choice": CHOICES[choice], "n": 2,
            "max_tokens": 96, "temperature": 0.9, "seed": 5}
    whole = (await hermes.client.post(PATH, json=body)).json()["choices"]
    r = await hermes.client.post(PATH, json={**body, "stream": True})
    events = [e for e in chunks(r.content) if isinstance(e, dict)]
    calls, finish = streamed_calls(events, 2)
    assert finish == [c["finish_reason"] for c in whole]
    assert choice == "required" or finish == ["tool_calls", "tool_calls"]
    for i in range(2):
        check_calls(calls[i], called(choice))
        expected = [c["function"] for c in whole[i]["message"]["tool_calls"]]
        assert [c["function"] for c in calls[i]] == expected
        content = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"] if c["index"] == i)
        assert content == (whole[i]["message"]["content"] or "")  # the calls' text is not content


async def test_auto_parses_what_the_model_writes(hermes: Any) -> None:
    """With `auto` the model decides; here a choice constraint makes it write one call, content around it."""
    call = '<tool_call>\n{"name": "w", "arguments": {"c": "Rome", "u": "C"}}\n</tool_call>'
    written = f"Let me see.\n{call}"
    body = {"model": "chat", "messages": USER, "tools": TOOLS, "max_tokens": 96, "guided_choice": [written]}
    message = (await hermes.client.post(PATH, json=body)).json()["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["content"] == "Let me see."
    [parsed] = message["message"]["tool_calls"]
    assert parsed["function"]["name"] == "w"
    assert json.loads(parsed["function"]["arguments"]) == {"c": "Rome", "u": "C"}
    events = chunks((await hermes.client.post(PATH, json={**body, "stream": True})).content)
    calls, finish = streamed_calls([e for e in events if isinstance(e, dict)], 1)
    assert finish == ["tool_calls"] and [c["function"] for c in calls[0]] == [parsed["function"]]
    content = "".join(c["delta"].get("content") or "" for e in events if isinstance(e, dict) for c in e["choices"])
    assert content.strip() == "Let me see."
    none = (await hermes.client.post(PATH, json={**body, "tool_choice": "none"})).json()["choices"][0]
    assert none["message"]["content"] == written and none["finish_reason"] == "stop"  # none: not parsed


async def test_the_template_gets_the_tools_and_the_tool_messages(hermes: Any, chat_import: Path) -> None:
    """The prompt is apply_chat_template(messages, tools=...)'s, with an assistant's calls (arguments as an
    object) and a tool's answer; with tool_choice none the tools are left out."""
    from transformers import AutoTokenizer

    template = hermes.engine.services["chat"].chat_template
    prompts: list[str] = []
    original = template.render
    def render(*args: Any) -> str:
        prompts.append(original(*args))
        return prompts[-1]

    template.render = render
    try:
        for tool_choice in ("auto", "none"):
            body = {"model": "chat", "messages": CONVERSATION, "tools": TOOLS, "tool_choice": tool_choice,
                    "max_tokens": 2}
            r = await hermes.client.post(PATH, json=body)
            assert r.status_code == 200, r.text
    finally:
        del template.render
    hf = AutoTokenizer.from_pretrained(str(chat_import / "checkpoints" / "chat"))
    expected = hf.apply_chat_template(cast(Any, AS_TRANSFORMERS), tools=cast(Any, TOOLS), chat_template=COMPACT_HERMES,
                                      add_generation_prompt=True, tokenize=False)
    assert prompts[0] == expected
    assert "w;add;nop;tag;" in prompts[0] and '"arguments": {"b": 2}' in prompts[0]
    assert "w;add" not in prompts[1] and "<|im_start|>tool\n18<|im_end|>" in prompts[1]


def test_qwen_style_template_renders_tools_and_tool_messages_as_transformers() -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    hf = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    expected = hf.apply_chat_template(cast(Any, AS_TRANSFORMERS), tools=cast(Any, TOOLS), chat_template=HERMES_TOOLS,
                                      add_generation_prompt=True, tokenize=False)
    ours = ChatTemplate(ChatTemplateSpec(HERMES_TOOLS, Path("chat_template.jinja"), dict(hf.special_tokens_map)))
    try:
        from service.api.openai.chat import template_messages
        from service.api.openai.chat_schemas import ChatCompletionRequest

        body = ChatCompletionRequest.model_validate({"messages": CONVERSATION, "tools": TOOLS})
        rendered = ours.render(template_messages(body.messages), [t.template_form() for t in body.tools or []])
    finally:
        ours.close()
    assert rendered == expected
    assert '<tools>\n{"type": "function", "function": {"name": "w"' in rendered and "<tool_response>\n18\n" in rendered


async def test_llama3_json_calls(llama3: Any) -> None:
    for choice in ("required", "add"):
        body = {"model": "chat", "messages": USER, "tools": TOOLS, "tool_choice": CHOICES[choice], "n": 2,
                "max_tokens": 96, "temperature": 1.0, "seed": 2, "parallel_tool_calls": False}
        r = await llama3.client.post(PATH, json=body)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            assert c["finish_reason"] == "tool_calls", c
            check_calls(c["message"]["tool_calls"], called(choice))


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name",
         ["no tool named 'nope'"]),
        ({"tools": None, "tool_choice": "required"}, "tool_choice", ["needs tools"]),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
         ["forces a tool call"]),
        ({"tools": [TOOLS[1], TOOLS[1]]}, "tools[1].function.name", ["'add' twice"]),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", []),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type", []),
        ({"tool_choice": "sometimes"}, "tool_choice", []),
        ({"tool_choice": "required", "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "frobnicate"}}}]}, "tools", ["cannot be used"]),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", ["the id of the call"]),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": CALLS}]}, "messages[0].tool_calls",
         ["only an assistant"]),
        ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content", ["required"]),
        ({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{oops"}}]}]},
         "messages[1].tool_calls[0].function.arguments", ["must be JSON text"]),
    ],
)
async def test_bad_tool_requests_are_422_naming_the_field(
    hermes: Any, change: dict[str, Any], param: str, words: list[str]
) -> None:
    body = {"model": "chat", "messages": USER, "tools": TOOLS, "max_tokens": 4, **change}
    r = await hermes.client.post(PATH, json={k: v for k, v in body.items() if v is not None})
    assert_openai_error(r, 422, param, *words)


# --- the parsers, without a model ----------------------------------------------------------------------------


def test_the_format_is_chosen_from_the_template() -> None:
    assert tool_format(HERMES_TOOLS).name == "hermes"
    assert tool_format(LLAMA3).name == tool_format(CHATML).name == "llama3_json"
    assert set(FORMATS) == {"hermes", "llama3_json"}


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', None, [("f", {"x": 1})]),
        ('Sure.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", '
         '"arguments": {"y": "<tool_call>"}}\n</tool_call>', "Sure.", [("f", {}), ("g", {"y": "<tool_call>"})]),
        ("no calls here", "no calls here", []),
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}', None, [("f", {"x": 1})]),  # cut before its end
        ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
        ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>', None, [("f", {"x": 2})]),
    ],
)
def test_hermes_parse(text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    parsed_content, parsed = HermesFormat().parse(text)
    assert parsed_content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
        ('<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"a": [1]}}', None,
         [("f", {}), ("g", {"a": [1]})]),
        ('The answer is {"name": "f"}', 'The answer is {"name": "f"}', []),
        ('{"name": "f", "parameters": {}} and more', '{"name": "f", "parameters": {}} and more', []),
        ('{"title": "not a call"}', '{"title": "not a call"}', []),
    ],
)
def test_llama3_json_parse(text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    parsed_content, parsed = Llama3JsonFormat().parse(text)
    assert parsed_content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize("size", [1, 2, 3, 7])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_stream_in_pieces_gives_the_same_calls_and_content(name: str, size: int) -> None:
    texts = {
        "hermes": 'Sure <tool_ca.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
                  '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
        "llama3_json": ' {"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
    }
    fmt = FORMATS[name]
    text = texts[name]
    stream = ToolStream(fmt, None)
    content, calls = "", list[ParsedCall]()
    for i in range(0, len(text), size):
        piece, found = stream.feed(text[i : i + size])
        content, calls = content + piece, calls + found
    piece, found = stream.close()
    content, calls = content + piece, calls + found
    whole_content, whole_calls = fmt.parse(text)
    assert content.strip() == (whole_content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
    assert len(calls) == 2
    one = ToolStream(fmt, 1)
    assert len(one.feed(text)[1] + one.close()[1]) == 1
