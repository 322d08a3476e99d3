"""POST /v1/chat/completions on the tiny chat import (a ChatML template) and the tiny generator (none):
the prompt the engine receives is apply_chat_template's, the response and stream shapes are OpenAI's, and
every unsupported request is a 4xx in OpenAI's error shape naming its field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.service.hf_reference import generate, reference

USER = [{"role": "user", "content": "Where is the train station?"}]
BASE = {"model": "chat", "messages": USER, "max_tokens": 6, "seed": 3}
PATH = "/v1/chat/completions"


@pytest.fixture
async def chat(serving: Callable[..., AbstractAsyncContextManager[Any]], chat_artifacts: Path) -> AsyncIterator[Any]:
    async with serving(artifacts_dir=chat_artifacts, models="chat,generator") as s:
        yield s


def hf_tokenizer(chat_import: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(chat_import / "checkpoints" / "chat"))


def chunks(body: bytes) -> list[Any]:
    lines = [line for line in body.decode("utf-8").split("\n") if line.startswith("data: ")]
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]


def assert_openai_error(response: Any, status: int, param: str | None, *words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    for word in words:
        assert word in error["message"], (word, error["message"])


async def test_the_engine_gets_apply_chat_templates_prompt(chat: Any, chat_import: Path) -> None:
    """The same token ids as transformers' apply_chat_template(tokenize=True), counted in usage; and
    greedy decoding gives transformers' generate() tokens on that prompt."""
    messages = [{"role": "system", "content": "Be brief."}, *USER,
                {"role": "assistant", "content": "Left."}, {"role": "user", "content": "Thanks!"}]
    expected = hf_tokenizer(chat_import).apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    generator = chat.engine.services["chat"]
    assert generator.chat_template is not None
    rendered = generator.chat_template.render(messages)
    assert generator.tokenizer.encode(rendered, add_special_tokens=False).ids == expected
    r = await chat.client.post(PATH, json={**BASE, "messages": messages, "temperature": 0, "logprobs": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(expected)
    choice = r.json()["choices"][0]
    model = reference(chat_import, "chat")  # a GPT-2
    ids = torch.tensor([expected])
    out = generate(model, ids, do_sample=False, max_new_tokens=6, pad_token_id=model.config.pad_token_id)
    generated = out[0, ids.shape[1]:].tolist()
    eos = model.config.eos_token_id
    generated = generated[: generated.index(eos)] if eos in generated else generated
    assert len(choice["logprobs"]["content"]) == len(generated) and len(generated) > 1
    assert choice["message"]["content"] == generator.tokenizer.decode(generated)


async def test_response_shape(chat: Any) -> None:
    r = await chat.client.post(PATH, json={**BASE, "n": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "chat"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    again = (await chat.client.post(PATH, json={**BASE, "n": 2})).json()
    assert [c["message"] for c in again["choices"]] == [c["message"] for c in body["choices"]]  # seeded


async def test_content_parts_developer_role_and_max_completion_tokens(chat: Any) -> None:
    text_parts = [{"type": "text", "text": "Where is the "}, {"type": "text", "text": "train station?"}]
    parts = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": text_parts}]
    plain = [{"role": "system", "content": "Be brief."}, *USER]
    both = {"max_completion_tokens": 3, "max_tokens": 9}
    a = (await chat.client.post(PATH, json={**BASE, "messages": parts, **both})).json()
    b = (await chat.client.post(PATH, json={**BASE, "messages": plain, "max_tokens": 3})).json()
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
    assert a["usage"]["completion_tokens"] <= 3


async def test_logprobs_in_chat_format(chat: Any) -> None:
    r = await chat.client.post(PATH, json={**BASE, "logprobs": True, "top_logprobs": 2, "temperature": 0})
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert content and "".join(t["token"] for t in content) == choice["message"]["content"]
    for token in content:
        assert set(token) == {"token", "logprob", "bytes", "top_logprobs"}
        assert token["bytes"] == list(token["token"].encode()) and token["logprob"] <= 0
        assert len(token["top_logprobs"]) == 2 and token["top_logprobs"][0]["token"] == token["token"]  # greedy


async def test_stream_with_usage(chat: Any) -> None:
    whole = (await chat.client.post(PATH, json={**BASE, "n": 2})).json()
    r = await chat.client.post(PATH, json={**BASE, "n": 2, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = chunks(r.content)
    assert events[-1] == "[DONE]"
    *body, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert all(e["object"] == "chat.completion.chunk" and e["usage"] is None for e in body)
    for index in (0, 1):
        mine = [e["choices"][0] for e in body if e["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert all("role" not in c["delta"] for c in mine[1:])
        assert [c["finish_reason"] for c in mine[:-1]] == [None] * (len(mine) - 1)
        assert mine[-1]["finish_reason"] == whole["choices"][index]["finish_reason"]
        text = "".join(c["delta"].get("content", "") for c in mine)
        assert text == whole["choices"][index]["message"]["content"]
    plain = chunks((await chat.client.post(PATH, json={**BASE, "stream": True})).content)
    assert "usage" not in plain[0] and plain[-1] == "[DONE]"


async def test_stop_strings(chat: Any) -> None:
    text = (await chat.client.post(PATH, json={**BASE, "max_tokens": 12})).json()["choices"][0]["message"]["content"]
    if len(text) < 3:
        pytest.skip("the random model ended at once")
    cut = (await chat.client.post(PATH, json={**BASE, "max_tokens": 12, "stop": [text[2:4]]})).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == text[: text.index(text[2:4])]


@pytest.mark.parametrize("model", [None, "tgi", "dummy"])
async def test_tgi_and_huggingface_hub_model_placeholders(chat: Any, model: str | None) -> None:
    body = {k: v for k, v in BASE.items() if k != "model"} | ({"model": model} if model else {})
    r = await chat.client.post(PATH, json=body)
    assert r.status_code == 200 and r.json()["model"] == "chat"


async def test_a_model_without_a_template_is_a_400_pointing_to_completions(chat: Any) -> None:
    r = await chat.client.post(PATH, json={**BASE, "model": "generator"})
    assert_openai_error(r, 400, "model", "no chat template", "/v1/completions")
    assert r.json()["error"]["code"] == "no_chat_template"


async def test_only_the_generator_no_template_anywhere(serving: Any) -> None:
    async with serving() as s:  # the tiny artifacts: our own generator, which has no template
        r = await s.client.post(PATH, json={"messages": USER})
        assert_openai_error(r, 400, "model", "'generator' has no chat template", "/v1/completions")
        assert PATH not in s.app.openapi()["paths"]


async def test_unknown_model_is_a_404(chat: Any) -> None:
    r = await chat.client.post(PATH, json={**BASE, "model": "gpt-4o"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "response_format", ["forces a tool call"]),
        ({"tool_choice": "required"}, "tool_choice", ["needs tools"]),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", ["needs tools"]),
        ({"messages": []}, "messages", ["at least 1"]),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", ["the id of the call"]),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", ["'user'"]),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
         "messages[0].content[0].type", ["'image_url'", "text parts only"]),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
         "messages[0].content[0].type", ["'input_audio'"]),
        ({"messages": [{"role": "user"}]}, "messages[0].content", ["required"]),
        ({"top_logprobs": 2}, "top_logprobs", ["logprobs"]),
        ({"max_tokens": 0}, "max_tokens", []),
        ({"functions": [{"name": "f"}]}, "functions", ["Extra inputs"]),
    ],
)
async def test_unsupported_requests_are_4xx_naming_the_field(
    chat: Any, change: dict[str, Any], param: str, words: list[str]
) -> None:
    r = await chat.client.post(PATH, json={**BASE, **change})
    assert_openai_error(r, 422, param, *words)


async def test_tools_with_tool_choice_none_are_accepted(chat: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = await chat.client.post(PATH, json={**BASE, "tools": tools, "tool_choice": "none",
                                           "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


async def test_a_template_that_refuses_is_a_422(chat: Any) -> None:
    # ChatML concatenates content: a message whose content the template cannot add (none) is refused.
    generator = chat.engine.services["chat"]
    from service.engine.tasks.generation.chat_template import ChatTemplate
    from service.runtime.chat_template_spec import ChatTemplateSpec

    spec = ChatTemplateSpec("{{ raise_exception('only one user turn, please') }}", Path("t.jinja"))
    original, generator.chat_template = generator.chat_template, ChatTemplate(spec)
    try:
        r = await chat.client.post(PATH, json=BASE)
    finally:
        generator.chat_template = original
    assert_openai_error(r, 422, "messages", "only one user turn, please")


async def test_too_long_prompt_and_budget_errors_name_the_clients_fields(chat: Any) -> None:
    long = [{"role": "user", "content": "word " * 400}]
    assert_openai_error(await chat.client.post(PATH, json={**BASE, "messages": long}), 422, "messages", "limit")


async def test_documented_with_its_schema(chat: Any) -> None:
    document = chat.app.openapi()
    operation = document["paths"][PATH]["post"]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    fields = {"messages", "stream_options", "max_completion_tokens", "logprobs", "top_logprobs"}
    assert fields <= set(schema["properties"])
    assert schema["examples"][0]["model"] == "chat"
    model = next(m for m in schema["properties"]["model"]["anyOf"] if m.get("type") == "string")
    assert model["enum"] == ["chat"]
    r = await chat.client.post(PATH, json=schema["examples"][0])
    assert r.status_code == 200, r.text


async def test_schemathesis_can_generate_chat_requests(chat: Any) -> None:
    """The chat body stays one schemathesis can draw data from (as every body, tests/service/test_api_openapi.py)."""
    import jsonschema_rs
    from jsonschema_rs import canonical

    document = chat.app.openapi()
    body = document["paths"][PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    form = jsonschema_rs.canonicalize({**body, "components": document["components"]})
    assert form.kind != canonical.CanonicalKind.RAW


async def test_a_template_that_does_not_compile_stops_start_up_naming_the_file(
    serving: Any, chat_artifacts: Path, tmp_path: Path
) -> None:
    import shutil

    shutil.copytree(chat_artifacts / "chat", tmp_path / "chat")
    (tmp_path / "chat" / "chat_template.jinja").write_text("{% for message in messages %}")
    from service.runtime.artifact import ArtifactError

    with pytest.raises(ArtifactError, match=r"chat_template\.jinja: the chat template does not compile"):
        async with serving(artifacts_dir=tmp_path, models="chat"):
            pass


async def test_streamed_logprobs_match_whole(chat: Any) -> None:
    args = {**BASE, "logprobs": True, "top_logprobs": 1, "temperature": 0}
    whole = (await chat.client.post(PATH, json=args)).json()["choices"][0]["logprobs"]["content"]
    events = chunks((await chat.client.post(PATH, json={**args, "stream": True})).content)[:-1]
    streamed = [t for e in events if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["content"]]
    assert [t["token"] for t in streamed] == [t["token"] for t in whole] and whole
    assert [t["logprob"] for t in streamed] == pytest.approx([t["logprob"] for t in whole], abs=1e-5)


async def test_a_lone_surrogate_in_a_message_is_a_422(chat: Any) -> None:
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "a\\udc00"}], "max_tokens": 3}'
    r = await chat.client.post(PATH, content=body, headers={"content-type": "application/json"})
    assert_openai_error(r, 422, "messages", "lone surrogate")
