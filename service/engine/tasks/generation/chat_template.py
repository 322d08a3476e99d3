"""Renders chat messages into a prompt with the model's own Jinja chat template, as `transformers`'
`apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` does, in the bounded sandbox of
template_sandbox.py: its own process, a deadline, an address-space limit and size limits.

A template is checked when the server loads it (it must compile and render sample conversations within the
bounds, else the server exits with one line) and when it is imported (scripts/import_checkpoint.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.engine.errors import InvalidInput
from service.engine.tasks.generation.template_process import DEFAULT_MEMORY_BYTES, SandboxRefusal, TemplateProcess
from service.engine.tasks.generation.template_sandbox import COMPILE, LIMIT, TEMPLATE_ERROR, UNSAFE
from service.runtime.artifact import ArtifactError
from service.runtime.chat_template_spec import ChatTemplateSpec


@dataclass(frozen=True)
class ChatMessages:
    """A chat request's messages (and tools), as apply_chat_template takes them: the model's template renders
    them into the prompt when the job is submitted."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_CHARS = 4 << 20
# Conversations every template is rendered with before it is served: a template that refuses one is
# fine (it may want a system turn, or strict alternation); one that takes too long or too much is not.
SAMPLE_CONVERSATIONS: tuple[list[dict[str, Any]], ...] = (
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
)
_WHY = {
    TEMPLATE_ERROR: "the model's chat template refused these messages: {}",
    UNSAFE: "the model's chat template tried an unsafe operation: {}",
    LIMIT: "the model's chat template went past the server's limits on these messages: {}",
}


class TemplateBoundsError(ValueError):
    """The template does not compile, or does not render sample conversations, within the bounds."""


def _check(process: TemplateProcess, special_tokens: dict[str, str], max_chars: int) -> None:
    """Compile the template and render the sample conversations: TemplateBoundsError naming what failed."""
    try:
        process.check()
    except SandboxRefusal as exc:
        why = "does not compile" if exc.kind == COMPILE else "cannot be compiled within the limits"
        raise TemplateBoundsError(f"the chat template {why} ({exc.message})") from None
    for messages in SAMPLE_CONVERSATIONS:
        try:
            process.render(_variables(messages, special_tokens), max_chars)
        except SandboxRefusal as exc:
            if exc.kind == LIMIT:
                raise TemplateBoundsError(
                    f"the chat template went past the limits on a {len(messages)}-message sample ({exc.message})"
                ) from None


def check_template_source(source: str, special_tokens: dict[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """The import-time check: TemplateBoundsError with one line when the template fails the bounds."""
    process = TemplateProcess(source, timeout_s)
    try:
        _check(process, special_tokens, DEFAULT_MAX_CHARS)
    finally:
        process.close()


def _variables(
    messages: list[dict[str, Any]], special_tokens: dict[str, str], tools: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        **special_tokens,
        "messages": messages,
        "add_generation_prompt": True,
        "tools": tools,  # as apply_chat_template(tools=...): the JSON-schema function dicts, or None
        "documents": None,
    }


class ChatTemplate:
    """One model's template, checked when loaded; `render` (blocking, off the event loop) per request."""

    def __init__(
        self,
        spec: ChatTemplateSpec,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self.special_tokens = dict(spec.special_tokens)
        self.source = spec.source  # read for the model's tool-call format (service/api/openai/tool_calls.py)
        self.max_chars = max_chars
        self.process = TemplateProcess(spec.source, timeout_s, memory_bytes)
        try:
            _check(self.process, self.special_tokens, max_chars)
        except TemplateBoundsError as exc:
            raise ArtifactError(f"{spec.file}: {exc}") from None  # at start-up: one line and an exit

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text (special tokens as text: tokenize it without adding any). A template that refuses
        the messages (`raise_exception`, a missing key, a sandbox violation, a limit) is the request's fault:
        a 422 quoting the template's message, never a 500."""
        try:
            text = self.process.render(_variables(messages, self.special_tokens, tools), self.max_chars)
        except SandboxRefusal as exc:
            raise InvalidInput(_WHY.get(exc.kind, _WHY[TEMPLATE_ERROR]).format(exc.message), "messages") from None
        try:
            text.encode()  # a lone surrogate (JSON's "\udc00") is no text a tokenizer takes
        except UnicodeEncodeError as exc:
            raise InvalidInput(
                f"the messages hold a lone surrogate ({exc.object[exc.start]!r}): not Unicode text", "messages"
            ) from None
        return text

    def close(self) -> None:
        self.process.close()
