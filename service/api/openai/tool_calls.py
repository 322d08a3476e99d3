"""Tool calling on chat completions: the model's tool-call format, chosen from its chat template (one format per
parser, `FORMATS`), turns what it writes into OpenAI's `tool_calls`, and builds the grammar that enforces a call
for `tool_choice` `required` or a named function (a Lark grammar in llguidance's dialect, the function's
parameters embedded with `%json`).

- hermes (Hermes, Qwen2.5 and the templates that write `<tool_call>`): one or more
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks;
- llama3_json (Llama 3.x): the whole message is `{"name": ..., "parameters": {...}}`, perhaps after
  `<|python_tag|>`, several separated by `;`.

`ToolStream` does the same for a stream: text that may be a call is held back until the call closes."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.engine.tasks.generation.constraints import Constraint

# The grammar writes compact JSON, as the JSON schemas of response_format
# (service/engine/tasks/generation/constraints.py).
_COMPACT = {"whitespace_flexible": False}
_EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Function:
    """One tool: its name and its parameters' JSON schema (None: no parameters)."""

    name: str
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"index": index} if index is not None else {}
        call.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        return call


def _call(value: Any, arguments_key: str) -> ParsedCall | None:
    """A call from a parsed JSON value: an object with a string `name` and object arguments."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _call_schema(function: Function, arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call's object; the parameters' `$defs` move to its root, where their `$ref`s
    (`#/$defs/...`) point."""
    parameters = dict(function.parameters) if function.parameters is not None else dict(_EMPTY_PARAMETERS)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": function.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
        "x-guidance": _COMPACT,
    }
    for defs in ("$defs", "definitions"):
        if defs in parameters:
            schema[defs] = parameters.pop(defs)
    return schema


class ToolFormat(Protocol):
    name: str

    def grammar(self, functions: list[Function], many: bool) -> str:
        """A Lark grammar for one call of one of the functions (several with `many`)."""
        ...

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """The content outside the calls (None when there is none) and the calls."""
        ...

    def safe_prefix(self, text: str, in_call: bool, at_start: bool) -> tuple[int, bool]:
        """For a stream: how much of `text` is content for sure, and whether a call starts right after it
        (`at_start`: no content came before `text`)."""
        ...


def _alternatives(functions: list[Function], arguments_key: str, wrap: tuple[str, str]) -> str:
    rules = [f"call: {' | '.join(f'call_{i}' for i in range(len(functions)))}"]
    for i, function in enumerate(functions):
        schema = json.dumps(_call_schema(function, arguments_key))
        parts = [json.dumps(wrap[0]) if wrap[0] else "", f"args_{i}", json.dumps(wrap[1]) if wrap[1] else ""]
        rules.append(f"call_{i}: " + " ".join(p for p in parts if p))
        rules.append(f"args_{i}: %json {schema}")
    return "\n".join(rules)


class HermesFormat:
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def grammar(self, functions: list[Function], many: bool) -> str:
        start = 'start: call ("\\n" call)*' if many else "start: call"
        return start + "\n" + _alternatives(functions, "arguments", (f"{self.OPEN}\n", f"\n{self.CLOSE}"))

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        content, calls, rest = [], [], text
        while (start := rest.find(self.OPEN)) >= 0:
            end = rest.find(self.CLOSE, start)
            body = rest[start + len(self.OPEN) : end if end >= 0 else len(rest)]
            after = end + len(self.CLOSE) if end >= 0 else len(rest)
            call = _parse_json(body, "arguments")
            content.append(rest[:start] if call is not None else rest[:after])
            calls.extend([call] if call is not None else [])
            rest = rest[after:]
        outside = ("".join(content) + rest).strip()
        return outside or None, calls

    def safe_prefix(self, text: str, in_call: bool, at_start: bool) -> tuple[int, bool]:
        if in_call:
            end = text.find(self.CLOSE)
            return (end + len(self.CLOSE), False) if end >= 0 else (0, True)
        start = text.find(self.OPEN)
        if start >= 0:
            return start, True
        return len(text) - _partial_suffix(text, self.OPEN), False


class Llama3JsonFormat:
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"

    def grammar(self, functions: list[Function], many: bool) -> str:
        start = 'start: call ("; " call)*' if many else "start: call"
        return start + "\n" + _alternatives(functions, "parameters", ("", ""))

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        body = text.strip().removeprefix(self.PYTHON_TAG).strip()
        decoder, calls, at = json.JSONDecoder(), [], 0
        while body.startswith("{", at):
            try:
                value, at = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                break
            call = _call(value, "parameters")
            if call is None:
                break
            calls.append(call)
            at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
        if calls and at == len(body):
            return None, calls
        return text.strip() or None, []

    def safe_prefix(self, text: str, in_call: bool, at_start: bool) -> tuple[int, bool]:
        """A message that starts as a call is held back whole (it is parsed at the end)."""
        if in_call:
            return 0, True
        head = text.lstrip()
        if not at_start:
            return len(text), False
        if not head:
            return 0, False  # only blanks so far: wait
        if head.startswith("{") or self.PYTHON_TAG.startswith(head[: len(self.PYTHON_TAG)]):
            return 0, True
        return len(text), False


def _parse_json(body: str, arguments_key: str) -> ParsedCall | None:
    try:
        return _call(json.loads(body), arguments_key)
    except json.JSONDecodeError:
        return None


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (held back: the marker may be coming)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), Llama3JsonFormat())}


def tool_format(template_source: str) -> ToolFormat:
    """The format a chat template's model writes its calls in: hermes when the template writes `<tool_call>`."""
    return FORMATS["hermes" if HermesFormat.OPEN in template_source else "llama3_json"]


def tool_constraint(fmt: ToolFormat, functions: list[Function], many: bool) -> Constraint:
    """The grammar that makes the model call one of `functions` (one or more calls with `many`)."""
    return Constraint("grammar", fmt.grammar(functions, many), "tools")


class ToolStream:
    """One streamed choice's text through a tool format: `feed` returns the content that is surely not a call
    and the calls that closed; `close` what was held back at the end."""

    def __init__(self, fmt: ToolFormat, max_calls: int | None) -> None:
        self.fmt, self.max_calls = fmt, max_calls
        self.pending, self.in_call, self.calls, self.at_start = "", False, 0, True
        self.blank = ""  # blanks between calls: content only if more content follows them

    def _take(self, calls: list[ParsedCall]) -> list[ParsedCall]:
        room = len(calls) if self.max_calls is None else max(0, self.max_calls - self.calls)
        calls = calls[:room]
        self.calls += len(calls)
        return calls

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        self.pending += text
        content: list[str] = []
        calls: list[ParsedCall] = []
        while self.pending:
            size, in_call = self.fmt.safe_prefix(self.pending, self.in_call, self.at_start)
            piece, self.pending = self.pending[:size], self.pending[size:]
            if self.in_call and piece:  # a whole call
                text_, found = self.fmt.parse(piece)
                content.append(text_ or "")
                calls.extend(self._take(found))
            else:
                content.append(piece)
                self.at_start = self.at_start and not piece.strip()
            if in_call == self.in_call and size == 0:
                break  # wait for more text
            self.in_call = in_call
        out = self.blank + "".join(content)
        self.blank = out if not out.strip() else ""
        return out if out.strip() else "", calls

    def close(self) -> tuple[str, list[ParsedCall]]:
        text, self.pending, self.in_call, self.blank = self.pending, "", False, ""
        if not text:
            return "", []
        content, calls = self.fmt.parse(text)
        return content or "", self._take(calls)
