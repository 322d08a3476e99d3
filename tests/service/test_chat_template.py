"""The chat template renderer against transformers' apply_chat_template (add_generation_prompt=True) on
templates in the styles real checkpoints ship, and the importer's ways of finding a checkpoint's template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from model.families.base import CheckpointError
from model.importing.hf_chat_template import find_chat_template, template_tokens
from service.engine.errors import InvalidInput
from service.engine.tasks.generation.chat_template import ChatTemplate
from service.runtime.artifact import ArtifactError
from service.runtime.chat_template_spec import ChatTemplateSpec
from tests.chat_templates import ALTERNATING, TEMPLATES

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Où est la gare ? <b>vite</b>"},
        {"role": "assistant", "content": "Tout droit, \"à gauche\"."},
        {"role": "user", "content": "Merci 🙂\nEt après ?"},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def ours(template: str, tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(ChatTemplateSpec(template, Path("chat_template.jinja"), dict(tokenizer.special_tokens_map)))


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_rendering_equals_apply_chat_template(hf_tokenizer: Any, name: str, conversation: int) -> None:
    messages = CONVERSATIONS[conversation]
    template = TEMPLATES[name]
    try:
        expected = hf_tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                                    tokenize=False)
    except Exception as exc:  # the template refuses: ours must too, as a 422 quoting its message
        with pytest.raises(InvalidInput) as refused:
            ours(template, hf_tokenizer).render(messages)
        assert str(exc) in refused.value.message and refused.value.field == "messages"
        return
    rendered = ours(template, hf_tokenizer).render(messages)
    assert rendered == expected
    assert rendered  # a template that renders nothing would pass vacuously


def test_raise_exception_is_a_422_with_the_templates_message(hf_tokenizer: Any) -> None:
    messages = [{"role": "assistant", "content": "I speak first."}]
    with pytest.raises(Exception, match="must alternate"):
        hf_tokenizer.apply_chat_template(messages, chat_template=ALTERNATING, tokenize=False)
    with pytest.raises(InvalidInput) as refused:
        ours(ALTERNATING, hf_tokenizer).render(messages)
    assert "Conversation roles must alternate" in refused.value.message and refused.value.field == "messages"


def test_template_failures_are_422s_not_500s(hf_tokenizer: Any) -> None:
    cases = {
        "{{ messages[0]['content'].__class__ }}{{ ''.__class__.__mro__ }}": "unsafe",  # sandbox
        "{% set ns = namespace(_secret=1) %}": "unsafe",
        "{{ messages[5]['content'] + 1 }}": "failed",  # an undefined item used: a TemplateError or TypeError
        "{{ 1 // 0 }}": "failed",
    }
    for template, kind in cases.items():
        with pytest.raises(InvalidInput) as refused:
            ours(template, hf_tokenizer).render([{"role": "user", "content": "hi"}])
        assert refused.value.field == "messages", template
        assert kind in refused.value.message or "refused" in refused.value.message, (template, refused.value.message)


def test_a_template_that_does_not_compile_is_an_artifact_error(hf_tokenizer: Any) -> None:
    with pytest.raises(ArtifactError, match="does not compile"):
        ours("{% for m in messages %}", hf_tokenizer)


def test_tojson_keeps_non_ascii_and_html(hf_tokenizer: Any) -> None:
    template = ours("{{ messages[0]['content'] | tojson }}", hf_tokenizer)
    rendered = template.render([{"role": "user", "content": "é<&>"}])
    assert rendered == '"é<&>"'


def test_the_importer_finds_the_template_where_transformers_does(tmp_path: Path) -> None:
    config = tmp_path / "tokenizer_config.json"
    assert find_chat_template(tmp_path) is None
    config.write_text(json.dumps({"chat_template": "A", "bos_token": {"content": "<s>", "special": True},
                                  "eos_token": "</s>"}))
    assert find_chat_template(tmp_path) == "A"
    assert template_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>"}
    config.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"},
                                                    {"name": "default", "template": "D"}]}))
    assert find_chat_template(tmp_path) == "D"
    config.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]}))
    with pytest.raises(CheckpointError, match="no 'default'"):
        find_chat_template(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("J")  # transformers' own file wins over the config's
    assert find_chat_template(tmp_path) == "J"


def test_generation_blocks_render_as_transformers_does() -> None:
    """Templates made for assistant-only training masks wrap the assistant turn in {% generation %}."""
    from transformers.utils.chat_template_utils import render_jinja_template

    source = ("{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' %}{% generation %}"
              "{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}"
              "{% if add_generation_prompt %}assistant: {% endif %}")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"}]
    ours = ChatTemplate(ChatTemplateSpec(source, Path("chat_template.jinja"))).render(messages)
    # Annotated `-> str`, it returns (rendered conversations, generation indices).
    theirs, _ = cast(
        "tuple[list[str], list[Any]]",
        render_jinja_template(conversations=[messages], chat_template=source, add_generation_prompt=True),
    )
    assert ours == theirs[0]


def test_arithmetic_failures_in_a_template_are_the_requests_422() -> None:
    source = "{% for i in range(messages|length * 100000) %}x{% endfor %}"
    with pytest.raises(InvalidInput) as caught:
        ChatTemplate(ChatTemplateSpec(source, Path("chat_template.jinja"))).render(
            [{"role": "user", "content": "a"}] * 101
        )
    assert caught.value.field == "messages"
