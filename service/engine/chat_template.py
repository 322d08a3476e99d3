"""Renders chat messages into a prompt with the model's own Jinja chat template, as `transformers`'
`apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` does: the same sandboxed
environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls), the same globals
(`raise_exception`, `strftime_now`, a `dict` and a `namespace` that refuse underscore names) and the same
`tojson` filter, which keeps non-ASCII and HTML characters as they are (Jinja's own escapes them).
Templates come from the checkpoint, so they are untrusted code: the sandbox is what keeps them inside."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.engine.errors import InvalidInput
from service.runtime.artifact import ArtifactError
from service.runtime.chat_template_spec import ChatTemplateSpec


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in a template, without the class itself (no attribute access to type internals)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing underscore-prefixed attributes (a route to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick: `namespace(self=...)` works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's part with it (for
    assistant-only training masks); rendering a prompt keeps the body as it is."""

    tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares it a plain set attribute

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


class ChatTemplate:
    """One model's template, compiled once; `render` is called per request."""

    def __init__(self, spec: ChatTemplateSpec) -> None:
        try:
            self.template = _environment().from_string(spec.source)
        except jinja2.exceptions.TemplateError as exc:
            raise ArtifactError(f"{spec.file}: the chat template does not compile ({exc})") from None  # at start-up
        self.special_tokens = dict(spec.special_tokens)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text (special tokens as text: tokenize it without adding any). A template that refuses
        the messages (`raise_exception`, a missing key, a sandbox violation) is the request's fault: a 422
        quoting the template's message, never a 500."""
        variables = {**self.special_tokens, "tools": None, "documents": None}
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.SecurityError as exc:
            raise InvalidInput(f"the model's chat template tried an unsafe operation: {exc}", "messages") from None
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidInput(f"the model's chat template refused these messages: {exc}", "messages") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError) as exc:
            raise InvalidInput(
                f"the model's chat template failed on these messages ({type(exc).__name__}: {exc})", "messages"
            ) from None
