"""Chat templates are untrusted code bounded in time, memory and size
(service/engine/tasks/generation/template_sandbox.py):
templates that loop, fold huge constants or build huge strings are refused when loaded and when imported, a
template that goes past a bound on one request's messages answers that request a 422, and the sandbox goes on
serving the next request."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from model.families.base import CheckpointError
from scripts.import_checkpoint import check_chat_template
from service.engine.errors import InvalidInput
from service.engine.tasks.generation.chat_template import ChatTemplate
from service.runtime.artifact import ArtifactError
from service.runtime.chat_template_spec import ChatTemplateSpec

LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# Each builds something huge from a short text; the first two are folded by Jinja's compiler unless the
# sandbox intercepts them; `center` is folded as a filter call and runs into the address-space limit.
HUGE = {
    "string times": "{{ 'x' * 10**9 }}",
    "list times": "{% set a = [0] * 10**8 %}{{ a|length }}",
    "format width": "{{ '{0:>1000000000}'.format('x') }}",
    "format width from an argument": "{{ '{0:>{1}}'.format('x', 10**9) }}",
    "percent width": "{{ '%1000000000s' % 'x' }}",
    "center filter": "{{ 'x'|center(1000000000) }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "big power": "{{ 7 ** 100000 }}",
}
PLAIN = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
USER = {"role": "user", "content": "hi"}


def template(source: str, timeout_s: float = 2.0) -> ChatTemplate:
    return ChatTemplate(ChatTemplateSpec(source, Path("chat_template.jinja")), timeout_s=timeout_s)


@pytest.mark.parametrize("name", sorted(HUGE))
def test_templates_that_build_huge_values_are_refused_when_loaded(name: str) -> None:
    started = time.monotonic()
    with pytest.raises(ArtifactError, match=r"chat_template.jinja: the chat template .*limit"):
        template(HUGE[name])
    assert time.monotonic() - started < 30  # bounded: the 1 GB builds are refused, not attempted in full


def test_a_template_that_loops_is_refused_when_loaded_after_its_deadline() -> None:
    with pytest.raises(ArtifactError, match=r"1-message sample \(the template took longer than 0.3 s\)"):
        template(LOOP + "{{ messages[0]['content'] }}", timeout_s=0.3)


def test_a_template_that_loops_on_some_messages_is_those_requests_422_and_the_next_renders() -> None:
    chat = template(f"{{% if messages|length > 8 %}}{LOOP}{{% endif %}}" + PLAIN, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=r"longer than 0\.3 s") as caught:
        chat.render([USER] * 9)
    assert caught.value.field == "messages"
    assert time.monotonic() - started < 5
    assert chat.render([USER]) == "<|user|>hi\n<|assistant|>"  # a fresh sandbox process took over


def test_a_template_that_builds_too_much_on_some_messages_is_those_requests_422() -> None:
    chat = template("{% if messages|length > 8 %}{{ 'x'|center(10**9) }}{% endif %}" + PLAIN)
    with pytest.raises(InvalidInput, match="limits on these messages: the template needed more memory"):
        chat.render([USER] * 9)
    assert chat.render([USER]) == "<|user|>hi\n<|assistant|>"


def test_the_rendered_prompt_has_a_length_limit() -> None:
    chat = ChatTemplate(ChatTemplateSpec(PLAIN, Path("chat_template.jinja")), max_chars=1000)
    with pytest.raises(InvalidInput, match="longer than 1,000 characters"):
        chat.render([{"role": "user", "content": "x" * 2000}])


def test_the_sandbox_holds_its_ground_against_internals() -> None:
    chat = template(PLAIN + "{{ messages.__class__.__mro__ if messages|length > 1 else '' }}")
    with pytest.raises(InvalidInput, match=r"unsafe operation|refused"):
        chat.render([USER, USER])


def test_each_process_renders_with_a_sandbox_of_its_own() -> None:
    """A front end forked from the engine (SERVE_API_PROCESSES > 1) starts its own child on first use."""
    chat = template(PLAIN)
    parent_child = chat.process._child
    assert parent_child is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked process renders, then reports whether it used a child of its own
        ok = chat.render([USER]) == "<|user|>hi\n<|assistant|>" and chat.process._child is not parent_child
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert chat.render([USER]) == "<|user|>hi\n<|assistant|>"  # the parent's own child is untouched


def test_the_importer_refuses_a_template_that_fails_the_bounds(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text(HUGE["string times"])
    with pytest.raises(CheckpointError, match="limit"):
        check_chat_template(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(PLAIN)
    check_chat_template(tmp_path)  # a plain template passes
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('system turn first') }}")
    check_chat_template(tmp_path)  # one that refuses the samples is the requests' business, not a failure


def test_text_that_is_not_valid_unicode_travels_to_the_sandbox_and_back_to_a_422() -> None:
    """A lone surrogate (JSON's "\udc00") is a str Python holds but UTF-8 cannot encode, nor a tokenizer take."""
    with pytest.raises(InvalidInput, match="lone surrogate") as caught:
        template(PLAIN).render([{"role": "user", "content": "a\udc00b"}])
    assert caught.value.field == "messages"
