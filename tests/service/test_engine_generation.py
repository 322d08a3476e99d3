"""Continuous batching and KV-cache decoding on the tiny generator: outputs never depend on the batch."""

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.engine.tasks.generation.decoding import GenerationParams, GenerationResult
from service.engine.tasks.generation.service import GenerationService
from service.engine.tokens.sampling import SamplingParams
from service.settings import Settings
from tests.service.conftest import Served, serve

PROMPTS = ["Hello", "The movie was wonderful, a delight from start", "Au commencement", "x", "Café 東京 🙂"]
PARAMS = [
    GenerationParams(max_new_tokens=12, sampling=SamplingParams(temperature=0.0), ignore_eos=True),
    GenerationParams(max_new_tokens=12, sampling=SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=5)),
    GenerationParams(max_new_tokens=12, sampling=SamplingParams(temperature=1.0, repetition_penalty=1.3, seed=11)),
]


@pytest.fixture(params=["appended", "in-place"])
def serving(
    request: pytest.FixtureRequest, make_settings: Callable[..., Settings], tiny_in_place_artifacts: Path
) -> Callable[..., AbstractAsyncContextManager[Served]]:
    """Every test here on both caches: the graph's present = past + new, and slots the graph writes in place."""
    folder = tiny_in_place_artifacts if request.param == "in-place" else None

    def start(wait_ready: bool = True, **overrides: Any) -> AbstractAsyncContextManager[Served]:
        if folder is not None:
            overrides.setdefault("artifacts_dir", folder)
        return serve(make_settings(**overrides), wait_ready)

    return start


async def run(gen: GenerationService, prompt: str, params: GenerationParams) -> GenerationResult:
    seq = gen.sequence(gen.tokenize(prompt, "prompt"), params)
    result: GenerationResult = await gen.scheduler.submit([seq], None, "prompt").result()
    return result


def ids(result: GenerationResult) -> list[int]:
    return [t.id for t in result.tokens]


def decode_steps_with_more_than_one_row(served) -> float:
    registry = served.engine.metrics.registry
    labels = {"model": "generator", "phase": "decode"}
    total = registry.get_sample_value("serve_batch_size_count", labels) or 0.0
    alone = registry.get_sample_value("serve_batch_size_bucket", {**labels, "le": "1.0"}) or 0.0
    return total - alone


async def test_batched_equals_alone(serving) -> None:
    jobs = [(p, params) for params in PARAMS for p in PROMPTS]
    async with serving(max_batch_size=1) as s:
        alone = [ids(await run(s.engine.generator, p, params)) for p, params in jobs]
    async with serving(max_batch_size=16) as s:
        batched = await asyncio.gather(*(run(s.engine.generator, p, params) for p, params in jobs))
        assert decode_steps_with_more_than_one_row(s) > 0
    assert [ids(r) for r in batched] == alone


async def test_a_request_joining_a_running_batch_gets_its_own_result(serving, slow_down) -> None:
    long = GenerationParams(max_new_tokens=30, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    short = PARAMS[1]
    async with serving(max_batch_size=1) as s:
        expected_long = ids(await run(s.engine.generator, PROMPTS[1], long))
        expected_short = ids(await run(s.engine.generator, PROMPTS[4], short))
    async with serving(max_batch_size=8) as s:
        gen = s.engine.generator
        slow_down(gen.model.session, 0.01)  # 30 steps take 0.3 s or more: the short one surely joins
        seq = gen.sequence(gen.tokenize(PROMPTS[1], "prompt"), long)
        events = gen.scheduler.submit([seq], None, "prompt").events()
        for _ in range(8):  # the long one is mid-way when the short one joins
            await anext(events)
        joined = await run(gen, PROMPTS[4], short)
        rest = [e async for e in events]
        assert ids(rest[-1]) == expected_long
        assert ids(joined) == expected_short
        assert decode_steps_with_more_than_one_row(s) > 0


async def test_a_prompt_fed_in_chunks_beside_a_running_batch_gets_the_tokens_of_a_whole_prefill(
    serving, slow_down, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 2-token chunk budget a joining prompt goes in at most two tokens per step, each chunk attending
    to the cache of the ones before: the same tokens as its prefill in one call."""
    long = GenerationParams(max_new_tokens=30, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    joining = [PARAMS[0], PARAMS[1]]
    async with serving(max_batch_size=1) as s:
        expected = [ids(await run(s.engine.generator, PROMPTS[2], p)) for p in joining]
    async with serving(max_batch_size=8, prefill_chunk_tokens=2) as s:
        gen = s.engine.generator
        calls: list[int] = []  # prompt columns (appended cache) or tokens (in place) per graph call
        decoder = gen.model.in_place
        if decoder is None:
            original_run = gen.model.run

            def recording_run(ids_, *a, **k):
                calls.append(ids_.shape[1])
                return original_run(ids_, *a, **k)

            monkeypatch.setattr(gen.model, "run", recording_run)
        else:
            original_feed = decoder.feed

            def recording_feed(slot, prompt, width):
                calls.append(width)
                return original_feed(slot, prompt, width)

            monkeypatch.setattr(decoder, "feed", recording_feed)
        slow_down(gen.model.session, 0.01)
        events = gen.scheduler.submit([gen.sequence(gen.tokenize(PROMPTS[0], "prompt"), long)], None, "prompt").events()
        await anext(events)  # decoding
        calls.clear()
        joined = await asyncio.gather(*(run(gen, PROMPTS[2], p) for p in joining))
        assert [e async for e in events][-1].finish_reason == "length"
    assert [ids(r) for r in joined] == expected
    assert len(gen.tokenize(PROMPTS[2], "prompt")) > 2
    assert calls and max(calls) <= 2  # no call fed a whole prompt


async def test_kv_cache_decoding_matches_recomputing_the_prefix(served) -> None:
    gen = served.engine.generator
    params = GenerationParams(max_new_tokens=10, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    prompt = gen.tokenize(PROMPTS[1], "prompt")
    cached = ids(await run(gen, PROMPTS[1], params))
    session, layers = gen.model.session, gen.model.n_layers
    a = gen.artifact
    tokens = list(prompt)
    for _ in range(10):  # no cache: feed the whole sequence every step
        T = len(tokens)
        feeds = {
            "input_ids": np.array([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, T), dtype=np.int64),
            "position_ids": np.arange(T, dtype=np.int64)[None],
        }
        for i in range(layers):
            for part in ("key", "value"):
                feeds[f"past_key_values.{i}.{part}"] = np.zeros((1, a.n_heads, 0, a.d_head), dtype=np.float32)
        logits = session.run(feeds, ["logits"])["logits"]
        tokens.append(int(np.argmax(logits[0, -1])))
    assert cached == tokens[len(prompt) :]


async def test_finish_reasons(served) -> None:
    gen = served.engine.generator
    greedy = SamplingParams(temperature=0.0)
    result = await run(gen, "Hello", GenerationParams(max_new_tokens=5, sampling=greedy, ignore_eos=True))
    assert result.finish_reason == "length" and result.completion_tokens == 5
    # Force eos with a logit bias: the first token ends the sequence. The end token is no token of the
    # completion: no event carries it and usage does not count it.
    eos = gen.artifact.special_tokens["eos"]
    biased = SamplingParams(temperature=0.0, logit_bias={eos: 100.0})
    seq = gen.sequence(gen.tokenize("Hello", "prompt"), GenerationParams(max_new_tokens=5, sampling=biased))
    (result,) = [event async for event in gen.scheduler.submit([seq], None, "prompt").events()]  # no token event
    assert result.finish_reason == "eos" and result.completion_tokens == 0 and result.tokens == []
    assert result.text == ""
    # With ignore_eos the end token is an ordinary (special, textless) token.
    kept = await run(gen, "Hello", GenerationParams(max_new_tokens=3, sampling=biased, ignore_eos=True))
    assert [t.id for t in kept.tokens] == [eos] * 3 and all(t.special for t in kept.tokens)
    assert kept.finish_reason == "length" and kept.completion_tokens == 3
    # Stop on text the model is known to produce.
    text = (await run(gen, "Hello", GenerationParams(max_new_tokens=12, sampling=greedy, ignore_eos=True))).text
    stop = text.strip()[2:5] or text[:1]
    result = await run(
        gen, "Hello", GenerationParams(max_new_tokens=12, sampling=greedy, stop=(stop,), ignore_eos=True)
    )
    assert result.finish_reason == "stop" and stop not in result.text and text.startswith(result.text)


async def test_a_request_read_for_results_hands_over_only_its_result(served) -> None:
    """Token events go to the event loop only for a handle that reads them: a non-streamed request is one
    hand-off (its result), a streamed one gets every token, and both get the same tokens."""
    gen = served.engine.generator
    params = GenerationParams(max_new_tokens=10, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    delivered: list[int] = []
    deliver = gen.scheduler._deliver

    def counting(emits, failures):
        delivered.append(len(emits))
        deliver(emits, failures)

    gen.scheduler._deliver = counting
    try:
        sequence = gen.sequence(gen.tokenize("Hello", "prompt"), params)
        whole = await gen.scheduler.submit([sequence], None, "prompt").result()
        assert delivered == [1]
        delivered.clear()
        handle = gen.scheduler.submit([gen.sequence(gen.tokenize("Hello", "prompt"), params)], None, "prompt")
        events = [e async for e in handle.events()]
    finally:
        gen.scheduler._deliver = deliver
    assert sum(delivered) == 11 and events[-1].tokens == whole.tokens  # 10 tokens, then the result
    assert [e.id for e in events[:-1]] == ids(whole)
