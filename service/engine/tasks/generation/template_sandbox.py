"""The Jinja environment chat templates run in, and the child process that runs them.

The environment is `transformers`' `apply_chat_template` one (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `dict` and a `namespace` that refuse
underscore names, a `tojson` that keeps non-ASCII and HTML characters), with size limits on what a template
can build: `*`, `**` and `%` are checked before they run (which also keeps Jinja from folding them at compile
time), `str.format` widths are bounded, and the rendered text has a length limit.

Templates come from checkpoints, so they are untrusted code. The sandbox keeps them away from Python's
internals; time and memory are bounded by running compile and render in this module's child process
(`python -m service.engine.tasks.generation.template_sandbox`, started by template_process.py) under an
address-space limit, which the parent kills when a deadline passes. The child speaks JSON lines on
stdin/stdout: one request, one answer.
"""

from __future__ import annotations

import json
import re
import resource
import string
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The most items (characters, list entries) one `*` may build, and the widest `format` / `%` field.
MAX_ITEMS = 1 << 20
_PERCENT_WIDTH = re.compile(r"%[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")
_DIGITS = re.compile(r"\d+")


class LimitError(jinja2.exceptions.SecurityError):
    """The template tried to build something past the sandbox's size limits."""


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


def _check_width(numbers: list[str], what: str) -> None:
    if any(int(n) > MAX_ITEMS for n in numbers):
        raise LimitError(f"a {what} field wider than {MAX_ITEMS:,} characters")


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with size limits on the operations that can build huge values from a short template."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            size, times = (_sized(left), right) if _sized(left) is not None else (_sized(right), left)
            if size is not None and isinstance(times, int) and size * times > MAX_ITEMS:
                raise LimitError(f"`*` would build {size * times:,} items (the limit is {MAX_ITEMS:,})")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * abs(left).bit_length() > 4096:
                raise LimitError("`**` would build a number of more than 4,096 bits")
        elif operator == "%" and isinstance(left, str):
            spans = _PERCENT_WIDTH.findall(left)
            if any("*" in span for span in spans):
                raise LimitError("`%` with a `*` width")
            _check_width([n for span in spans for n in span if n], "`%`")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fields = list(string.Formatter().parse(value.__self__))

        def checked(*args: Any, **kwargs: Any) -> str:
            for _, _, spec, _ in fields:
                if spec and "{" in spec:
                    raise LimitError("`format` with a width taken from an argument")
                _check_width(_DIGITS.findall(spec or ""), "`format`")
            return wrapped(*args, **kwargs)

        return checked


def environment() -> BoundedEnvironment:
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


def render_bounded(template: jinja2.Template, max_chars: int, **variables: Any) -> str:
    """The rendered text, refused once it grows past `max_chars`."""
    parts, size = [], 0
    for part in template.generate(**variables):
        size += len(part)
        if size > max_chars:
            raise LimitError(f"the rendered prompt is longer than {max_chars:,} characters")
        parts.append(part)
    return "".join(parts)


# --- the child process -------------------------------------------------------------------------------------

# What a refusal says to the parent: the request's fault (the template refused these messages, or hit a
# limit), or the template's own (it does not compile).
TEMPLATE_ERROR, UNSAFE, LIMIT, COMPILE = "template_error", "unsafe", "limit", "compile"


def _answer(request: dict[str, Any], env: BoundedEnvironment, compiled: dict[str, jinja2.Template]) -> dict[str, Any]:
    try:
        if request["op"] == "compile":
            try:
                compiled[request["key"]] = env.from_string(request["source"])
            except jinja2.exceptions.TemplateSyntaxError as exc:
                return {"error": COMPILE, "message": str(exc)}
            return {"ok": True}
        text = render_bounded(compiled[request["key"]], request["max_chars"], **request["variables"])
        return {"ok": True, "text": text}
    except MemoryError:
        return {"error": LIMIT, "message": "the template needed more memory than the sandbox allows"}
    except LimitError as exc:
        return {"error": LIMIT, "message": str(exc)}
    except jinja2.exceptions.SecurityError as exc:
        return {"error": UNSAFE, "message": str(exc)}
    except jinja2.exceptions.TemplateError as exc:
        return {"error": TEMPLATE_ERROR, "message": str(exc)}
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError) as exc:
        return {"error": TEMPLATE_ERROR, "message": f"{type(exc).__name__}: {exc}"}


def serve(memory_bytes: int) -> None:
    """Answer requests from stdin until it closes, in at most `memory_bytes` of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    env, compiled = environment(), dict[str, jinja2.Template]()
    for line in sys.stdin:
        answer = _answer(json.loads(line), env, compiled)
        sys.stdout.write(json.dumps(answer) + "\n")  # ASCII: a lone surrogate travels as its escape
        sys.stdout.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
