"""Imported Llama, Qwen2 and Mistral checkpoints through the running server: greedy tokens equal to
transformers' generate() with prompts batched together and prefilled in chunks, logprobs equal to its
scores, seeded sampling reproducible and streamed alike, and the checkpoint's end tokens and default
max_new_tokens honoured."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from model.importing.hf_artifact import import_to_artifact
from tests.hf_checkpoints import DECODER_CHECKPOINTS
from tests.service.hf_reference import Serving, generate, generated, reference, serving_artifacts, tokenizer
from tests.service.sse_events import events

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MAX_NEW = 8
PROMPTS = ["The movie was wonderful, a delight from start to finish.", "Dull.", "And God said, let there be light."]


def end_tokens(artifact: Path) -> set[int]:
    config = json.loads((artifact / "config.json").read_text())
    return set(config.get("eos_token_ids") or [config["special_tokens"]["eos"]])


def greedy(model: PreTrainedModel, ids: list[int], ends: set[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens (cut before the first end token, which the server does not return) and
    the log-probabilities of each."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    out = generated(model, torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW, repetition_penalty=1.0,
                    eos_token_id=sorted(ends), pad_token_id=min(ends), output_scores=True,
                    return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput) and out.scores is not None, type(out).__name__
    tokens = out.sequences[0, len(ids):].tolist()
    logprobs = [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(out.scores, tokens, strict=False)]
    cut = next((i for i, t in enumerate(tokens) if t in ends), len(tokens))
    return tokens[:cut], logprobs[:cut]


@pytest.fixture
def serving_decoders(serving: Serving, hf_decoder_imports: Path) -> Serving:
    return serving_artifacts(serving, hf_decoder_imports / "artifacts")


@pytest.mark.parametrize("name", list(DECODER_CHECKPOINTS))
async def test_greedy_tokens_and_logprobs_match_transformers(serving_decoders: Any, hf_decoder_imports: Path,
                                                             name: str) -> None:
    artifact = hf_decoder_imports / "artifacts" / name
    model, tok, ends = reference(hf_decoder_imports, name), tokenizer(hf_decoder_imports, name), end_tokens(artifact)
    async with serving_decoders(models=name, prefill_chunk_tokens=4, max_wait_ms=20.0) as s:
        # Sent together: they share batches (continuous batching) and their prompts are prefilled in chunks.
        responses = await asyncio.gather(*(s.client.post("/v1/generate", json={
            "prompt": prompt, "temperature": 0, "repetition_penalty": 1.0,  # not the "llama" checkpoint's 1.05
            "logprobs": True, "max_new_tokens": MAX_NEW, "model": name})
            for prompt in PROMPTS))
    lengths = []
    for prompt, r in zip(PROMPTS, responses, strict=True):
        assert r.status_code == 200, r.text
        served = r.json()["tokens"]
        expected, logprobs = greedy(model, tok.encode(prompt).ids, ends)
        assert [t["id"] for t in served] == expected, prompt
        assert [t["logprob"] for t in served] == pytest.approx(logprobs, abs=1e-3)
        lengths.append(len(expected))
    assert max(lengths) == MAX_NEW  # not a comparison of empty completions


async def test_seeded_sampling_is_reproducible_and_streams_alike(serving_decoders: Any) -> None:
    request = {"prompt": PROMPTS[0], "temperature": 0.9, "top_p": 0.95, "top_k": 50, "seed": 7, "logprobs": True,
               "max_new_tokens": MAX_NEW, "ignore_eos": True, "model": "qwen2"}
    async with serving_decoders(models="qwen2") as s:
        first, second = [(await s.client.post("/v1/generate", json=request)).json() for _ in range(2)]
        streamed = events((await s.client.post("/v1/generate", json={**request, "stream": True})).content)
        other = (await s.client.post("/v1/generate", json={**request, "seed": 8})).json()
    assert [t["id"] for t in first["tokens"]] == [t["id"] for t in second["tokens"]]
    assert first["text"] == second["text"] and len(first["tokens"]) == MAX_NEW
    assert [d["id"] for name, d in streamed if name == "token"] == [t["id"] for t in first["tokens"]]
    assert streamed[-1][1]["text"] == first["text"]
    assert [t["id"] for t in other["tokens"]] != [t["id"] for t in first["tokens"]]


async def test_completions_serve_a_grouped_query_model(serving_decoders: Any) -> None:
    async with serving_decoders(models="mistral") as s:
        r = await s.client.post("/v1/completions", json={"model": "mistral", "prompt": "Dull.", "max_tokens": 4,
                                                         "temperature": 0, "logprobs": 2, "stream": False})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 4


async def test_generation_config_end_tokens_and_default_length(serving_decoders: Any, hf_decoder_imports: Path,
                                                               tmp_path: Path) -> None:
    """The "llama" checkpoint's generation_config.json: max_new_tokens 12 when a request says none; and a
    copy whose eos_token_ids list a later greedy token ends there, with finish_reason eos."""
    async with serving_decoders(models="llama") as s:
        r = await s.client.post("/v1/generate", json={"prompt": PROMPTS[1], "temperature": 0, "ignore_eos": True,
                                                      "logprobs": True, "model": "llama"})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["usage"]["completion_tokens"] == 12 and first["finish_reason"] == "length"
    drawn = [t["id"] for t in first["tokens"]]
    cut = next((i for i in range(1, len(drawn)) if drawn[i] not in drawn[:i]), None)
    assert cut is not None, f"the random model repeats one token: {drawn}"
    shutil.copytree(hf_decoder_imports / "artifacts" / "llama", tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps(config | {"eos_token_ids": [1, drawn[cut]]}))
    async with serving_decoders(models="llama", artifacts_dir=tmp_path) as s:
        r = await s.client.post("/v1/generate", json={"prompt": PROMPTS[1], "temperature": 0, "logprobs": True,
                                                      "model": "llama"})
    assert r.status_code == 200, r.text
    assert r.json()["finish_reason"] == "eos"
    assert [t["id"] for t in r.json()["tokens"]] == drawn[:cut]


async def test_generation_config_sampling_defaults_fill_what_a_request_leaves_out(serving_decoders: Any) -> None:
    """The "llama" checkpoint's defaults (temperature 0.7, top_p 0.9, top_k 20, repetition_penalty 1.05) are
    what a seeded request without sampling settings gets, on the native and the OpenAI routes, as vLLM takes
    generation_config.json; a setting the request states wins (temperature 0: greedy)."""
    defaults = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}
    plain = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}
    base = {"prompt": PROMPTS[0], "model": "llama", "seed": 7, "max_new_tokens": 12, "ignore_eos": True}

    async def generated(route: str, settings: dict[str, Any]) -> str:
        """The generated text (the same 12 tokens give the same text on both routes)."""
        body = base | settings
        if route == "/v1/completions":
            body = {k: v for k, v in body.items() if k != "max_new_tokens"} | {"max_tokens": 12}
        r = await s.client.post(route, json=body)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"] if route == "/v1/completions" else r.json()["text"])

    async with serving_decoders(models="llama") as s:
        for route in ("/v1/generate", "/v1/completions"):
            left_out = await generated(route, {})
            assert left_out == await generated(route, defaults), route
            assert left_out != await generated(route, plain), route
        greedy_text = await generated("/v1/generate", {"temperature": 0})
        assert greedy_text == await generated("/v1/generate", {"temperature": 0, "seed": 8})


async def test_attention_maps_match_transformers(serving: Serving, hf_decoder_imports: Path, tmp_path: Path) -> None:
    """Imported with --kv-cache appended: every query head's map (grouped-query: 4 query heads over 2 key/value
    heads), as transformers' eager attention computes it over the tokens fed. The default import (the cache
    written in place) has none: a 422 that names the field."""
    model = reference(hf_decoder_imports, "llama3")
    import_to_artifact(hf_decoder_imports / "checkpoints" / "llama3", tmp_path / "llama3", "llama3", int8=False,
                       kv_cache="appended")
    body = {"prompt": PROMPTS[2], "max_new_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_attention": True, "model": "llama3"}
    async with serving_artifacts(serving, hf_decoder_imports / "artifacts")(models="llama3") as s:
        refused = await s.client.post("/v1/generate", json=body)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "return_attention"
    async with serving_artifacts(serving, tmp_path)(models="llama3") as s:
        r = await s.client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    attention = r.json()["attention"]
    layers = np.array(attention["layers"])  # [L, H, n, n] over the tokens fed
    tok = tokenizer(hf_decoder_imports, "llama3")
    fed = torch.tensor([[tok.token_to_id(t) for t in attention["tokens"]]])
    with torch.no_grad():
        theirs = model(fed, output_attentions=True).attentions
    expected = np.stack([a[0].numpy() for a in theirs])
    assert layers.shape == expected.shape == (2, 4, fed.shape[1], fed.shape[1])
    assert np.abs(layers - expected).max() < 1e-3


async def test_bad_words_are_never_generated(serving_decoders: Any, hf_decoder_imports: Path, tmp_path: Path) -> None:
    """config.json's bad_words_ids (from generation_config.json): greedy decoding then equals transformers'
    generate(bad_words_ids=...) on the same tokens."""
    artifact = hf_decoder_imports / "artifacts" / "mistral"
    model, tok = reference(hf_decoder_imports, "mistral"), tokenizer(hf_decoder_imports, "mistral")
    ids = tok.encode(PROMPTS[0]).ids
    free, _ = greedy(model, ids, end_tokens(artifact))
    bad = sorted(set(free[:3]))
    shutil.copytree(artifact, tmp_path / "mistral")
    config = json.loads((artifact / "config.json").read_text())
    (tmp_path / "mistral" / "config.json").write_text(json.dumps(config | {"bad_words_ids": [[t] for t in bad]}))
    async with serving_decoders(models="mistral", artifacts_dir=tmp_path) as s:
        r = await s.client.post("/v1/generate", json={"prompt": PROMPTS[0], "temperature": 0, "logprobs": True,
                                                      "max_new_tokens": MAX_NEW, "ignore_eos": True,
                                                      "model": "mistral"})
    assert r.status_code == 200, r.text
    served = [t["id"] for t in r.json()["tokens"]]
    prompt = torch.tensor([ids])
    expected = generate(model, prompt, do_sample=False, max_new_tokens=MAX_NEW, bad_words_ids=[[t] for t in bad],
                        eos_token_id=None, pad_token_id=1)
    assert not set(served) & set(bad)
    assert served == expected[0, len(ids):].tolist()


async def test_prompts_fed_in_chunks_beside_a_running_batch_match_transformers(
    serving_decoders: Any, hf_decoder_imports: Path, slow_down: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 2-token chunk budget, prompts that join a decoding batch are prefilled two tokens at most per
    step into the grouped-query cache: still transformers' greedy tokens."""
    from service.engine.tasks.generation.decoding import GenerationParams
    from service.engine.tokens.sampling import SamplingParams

    artifact = hf_decoder_imports / "artifacts" / "qwen2"
    model, tok = reference(hf_decoder_imports, "qwen2"), tokenizer(hf_decoder_imports, "qwen2")
    async with serving_decoders(models="qwen2", max_batch_size=8, prefill_chunk_tokens=2) as s:
        gen = s.engine.generator
        calls: list[int] = []  # prompt tokens per graph call (an import writes its cache in place)
        decoder = gen.model.in_place
        assert decoder is not None
        original = decoder.feed

        def counted(slot: int, prompt: list[int], width: int) -> Any:
            calls.append(width)
            return original(slot, prompt, width)

        monkeypatch.setattr(decoder, "feed", counted)
        slow_down(gen.model.session, 0.01)
        # Decodes for longer than the joining prompts take to go in, a column per row per step.
        long = GenerationParams(max_new_tokens=55, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
        running = gen.scheduler.submit([gen.sequence(gen.tokenize(PROMPTS[1], "prompt"), long)], None, "prompt")
        events = running.events()
        await anext(events)  # decoding
        calls.clear()
        joined = await asyncio.gather(*(s.client.post("/v1/generate", json={
            "prompt": prompt, "temperature": 0, "max_new_tokens": MAX_NEW, "logprobs": True, "model": "qwen2"})
            for prompt in (PROMPTS[0], PROMPTS[2])))
        assert [e async for e in events][-1].finish_reason == "length"
    assert calls and max(calls) <= 2, str(calls)  # no call fed a whole prompt
    for prompt, r in zip((PROMPTS[0], PROMPTS[2]), joined, strict=True):
        assert r.status_code == 200, r.text
        expected, _ = greedy(model, tok.encode(prompt).ids, end_tokens(artifact))
        assert [t["id"] for t in r.json()["tokens"]] == expected, prompt
