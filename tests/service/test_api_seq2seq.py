"""Imported T5 (ReLU, tied head), Flan-T5 (gated GELU) and M2M100 (NLLB's class) through the running server:
greedy and beam-4 tokens equal to transformers' generate() (the exported decoder's relative position bias
with the KV cache; M2M100's target language forced first and its source language token as the tokenizer puts
it), the language fields refused by name where they do not apply, streaming and attention maps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from tests.service.hf_reference import Serving, generate, reference, served_translations, serving_artifacts, tokenizer
from tests.service.sse_events import events

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MAX_NEW = 8
SOURCES = ["The movie was wonderful, a delight from start to finish.", "Dull.", "And God said, let there be light."]


@pytest.fixture
def serving_seq2seq(serving: Serving, hf_seq2seq_imports: Path) -> Serving:
    return serving_artifacts(serving, hf_seq2seq_imports / "artifacts")


async def streamed_and_attention(s: Any, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events of ``body`` streamed, and the first translation's attention of it answered whole."""
    r = await s.client.post("/v1/translate", json=body | {"stream": True})
    assert r.status_code == 200, r.text
    streamed = [data for _, data in events(r.content)]
    r = await s.client.post("/v1/translate", json=body | {"return_attention": True})
    assert r.status_code == 200, r.text
    return streamed, r.json()["translations"][0]["attention"]


def expected_tokens(model: PreTrainedModel, ids: list[int], num_beams: int, forced: int | None) -> list[int]:
    """transformers' generated tokens after the start token, up to (without) the end token."""
    out = generate(model, torch.tensor([ids]), num_beams=num_beams, do_sample=False, max_new_tokens=MAX_NEW,
                   length_penalty=1.0, early_stopping=False, no_repeat_ngram_size=0, forced_bos_token_id=forced)
    tokens: list[int] = out[0, 1:].tolist()
    eos = model.config.eos_token_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


T5_SOURCES = ["translate English to French: The movie was wonderful, a delight from start to finish.",
              "translate English to French: Dull.", "And God said, Let there be light: and there was light."]


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("name", ["t5", "flan-t5"])
async def test_t5_tokens_match_transformers(
    serving_seq2seq: Any, hf_seq2seq_imports: Path, name: str, num_beams: int
) -> None:
    model, tok = reference(hf_seq2seq_imports, name), tokenizer(hf_seq2seq_imports, name)
    served = await served_translations(serving_seq2seq, name, T5_SOURCES, num_beams, MAX_NEW, n_best=num_beams)
    for source, translation in zip(T5_SOURCES, served, strict=True):
        tokens = expected_tokens(model, tok.encode(source).ids, num_beams, None)
        assert translation["text"] == tok.decode(tokens, skip_special_tokens=True), (source, num_beams)
        assert translation["output_tokens"] == len(tokens)


async def test_t5_streams_and_returns_attention(serving_seq2seq: Any, hf_seq2seq_imports: Path) -> None:
    model, tok = reference(hf_seq2seq_imports, "flan-t5"), tokenizer(hf_seq2seq_imports, "flan-t5")
    tokens = expected_tokens(model, tok.encode(T5_SOURCES[0]).ids, 1, None)
    body = {"text": T5_SOURCES[0], "model": "flan-t5", "num_beams": 1, "max_new_tokens": MAX_NEW,
            "no_repeat_ngram_size": 0}
    async with serving_seq2seq(models="flan-t5") as s:
        streamed, attention = await streamed_and_attention(s, body)
    assert [e["id"] for e in streamed if e["type"] == "token"] == tokens
    assert streamed[-1]["translation"]["text"] == tok.decode(tokens, skip_special_tokens=True)
    assert len(attention["target_tokens"]) == len(tokens)
    assert attention["decoder_input_tokens"][0] == "<pad>"  # T5 starts from the pad token


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize(("source_lang", "target_lang"), [(None, "de"), ("fr", "__en__"), (None, None)])
async def test_m2m100_tokens_match_transformers(
    serving_seq2seq: Any, hf_seq2seq_imports: Path, num_beams: int, source_lang: str | None, target_lang: str | None
) -> None:
    model, tok = reference(hf_seq2seq_imports, "m2m_100"), tokenizer(hf_seq2seq_imports, "m2m_100")
    body: dict[str, Any] = {"text": SOURCES, "model": "m2m_100", "num_beams": num_beams, "n_best": num_beams,
                            "max_new_tokens": MAX_NEW, "no_repeat_ngram_size": 0, "length_penalty": 1.0}
    body |= {k: v for k, v in (("source_lang", source_lang), ("target_lang", target_lang)) if v is not None}
    async with serving_seq2seq(models="m2m_100") as s:
        r = await s.client.post("/v1/translate", json=body)
        assert r.status_code == 200, r.text
        served = r.json()["translations"]
    # The checkpoint's generation_config.json forces __fr__ when the request names no target.
    forced = tok.token_to_id(f"__{(target_lang or 'fr').strip('_')}__")
    for source, translation in zip(SOURCES, served, strict=True):
        ids = tok.encode(source).ids
        if source_lang is not None:  # the tokenizer's template starts with __en__
            language = tok.token_to_id(f"__{source_lang}__")
            assert language is not None, source_lang
            ids = [language, *ids[1:]]
        tokens = expected_tokens(model, ids, num_beams, forced)
        assert tokens[0] == forced
        assert translation["input_tokens"] == len(ids)
        assert translation["text"] == tok.decode(tokens, skip_special_tokens=True), (source, num_beams)
        assert translation["output_tokens"] == len(tokens)


async def test_m2m100_streams_and_returns_attention(serving_seq2seq: Any, hf_seq2seq_imports: Path) -> None:
    model, tok = reference(hf_seq2seq_imports, "m2m_100"), tokenizer(hf_seq2seq_imports, "m2m_100")
    forced = tok.token_to_id("__de__")
    tokens = expected_tokens(model, tok.encode(SOURCES[0]).ids, 1, forced)
    body = {"text": SOURCES[0], "model": "m2m_100", "num_beams": 1, "max_new_tokens": MAX_NEW,
            "no_repeat_ngram_size": 0, "target_lang": "de"}
    async with serving_seq2seq(models="m2m_100") as s:
        streamed, attention = await streamed_and_attention(s, body)
    assert [e["id"] for e in streamed if e["type"] == "token"][: len(tokens)] == tokens
    assert streamed[-1]["translation"]["text"] == tok.decode(tokens, skip_special_tokens=True)
    assert attention["source_tokens"][0] == "__en__"
    assert attention["target_tokens"][0] == "__de__"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("target_lang", "xx", "unknown language code 'xx'"),
    ("source_lang", "klingon", "unknown language code 'klingon'"),
])
async def test_unknown_language_code_is_refused_by_field(
    serving_seq2seq: Any, field: str, value: str, message: str
) -> None:
    async with serving_seq2seq(models="m2m_100") as s:
        r = await s.client.post("/v1/translate", json={"text": "Dull.", "model": "m2m_100", field: value})
    assert r.status_code == 422, r.text
    assert message in r.text and field in r.text
    assert "en, fr, de" in r.text or "de, en, fr" in r.text  # the codes it has


@pytest.mark.parametrize("field", ["source_lang", "target_lang"])
async def test_language_fields_on_a_one_direction_model_are_refused(serving_seq2seq: Any, field: str) -> None:
    async with serving_seq2seq(models="t5") as s:
        r = await s.client.post("/v1/translate", json={"text": "Dull.", "model": "t5", field: "fr"})
    assert r.status_code == 422, r.text
    assert "not multilingual" in r.text and field in r.text
