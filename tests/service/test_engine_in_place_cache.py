"""The in-place key/value cache (service/engine/cache/slots.py, in_place.py): prefix reuse gives the tokens and
logprobs of a whole prefill, admission keeps within SERVE_KV_CACHE_BYTES, and every slot comes back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.engine.cache.prefix import BLOCK, PrefixCache
from service.engine.cache.slots import SlotBuffers, bytes_per_token
from service.engine.tasks.generation.decoding import GenerationParams, GenerationResult
from service.engine.tasks.generation.service import GenerationService
from service.engine.tokens.sampling import SamplingParams
from service.settings import Settings
from tests.service.conftest import Served, serve

SYSTEM = "In the beginning God created the heavens and the earth. " * 3  # several whole blocks of tokens
GREEDY = GenerationParams(max_new_tokens=8, sampling=SamplingParams(temperature=0.0), ignore_eos=True, logprobs=3)


@pytest.fixture
def serving(
    make_settings: Callable[..., Settings], tiny_in_place_artifacts: Path
) -> Callable[..., AbstractAsyncContextManager[Served]]:
    def start(**overrides: Any) -> AbstractAsyncContextManager[Served]:
        return serve(make_settings(**{"artifacts_dir": tiny_in_place_artifacts, **overrides}))

    return start


async def generate(gen: GenerationService, prompt: str, params: GenerationParams = GREEDY) -> GenerationResult:
    seq = gen.sequence(gen.tokenize(prompt, "prompt"), params)
    result: GenerationResult = await gen.scheduler.submit([seq], None, "prompt").result()
    return result


def tokens_and_logprobs(result: GenerationResult) -> list[tuple[int, float | None, list[float]]]:
    return [(t.id, t.logprob, [top.logprob for top in t.top_logprobs or []]) for t in result.tokens]


def sample(served: Served, name: str) -> float:
    return served.engine.metrics.registry.get_sample_value(name, {"model": "generator"}) or 0.0


async def test_a_cached_prefix_gives_the_tokens_and_logprobs_of_a_whole_prefill(serving) -> None:
    prompts = [SYSTEM + "Then light.", SYSTEM + "And darkness.", SYSTEM + "Then light."]
    async with serving(prefix_cache_fraction=0.0) as s:
        uncached = [tokens_and_logprobs(await generate(s.engine.generator, p)) for p in prompts]
        assert s.engine.generator.model.in_place is not None and s.engine.generator.model.in_place.prefixes is None
    async with serving() as s:
        cached = [tokens_and_logprobs(await generate(s.engine.generator, p)) for p in prompts]
        hits, queries = sample(s, "serve_prefix_cache_hits_total"), sample(s, "serve_prefix_cache_queries_total")
        system_tokens = len(s.engine.generator.tokenize(SYSTEM, "prompt"))
    assert cached == uncached
    assert system_tokens >= 2 * BLOCK
    # The first prompt finds nothing; the two after it reuse the system prompt's whole blocks at least.
    assert hits >= 2 * (system_tokens // BLOCK) * BLOCK and queries > hits


async def test_prompts_admitted_together_reuse_the_prefix_of_those_fed_before_them(serving) -> None:
    """One request's prompts (and `n` choices) are admitted together and fed one after another: each looks the
    store up as its turn comes, so the second and third find the first's system prompt."""
    prompts = [SYSTEM + "Then light.", SYSTEM + "And darkness.", SYSTEM + "And water."]

    async def together(gen: GenerationService) -> list[list[tuple[int, float | None, list[float]]]]:
        sequences = [gen.sequence(gen.tokenize(p, "prompt"), GREEDY) for p in prompts]
        results = await gen.scheduler.submit(sequences, None, "prompt").results()
        return [tokens_and_logprobs(r) for r in results]

    async with serving(prefix_cache_fraction=0.0) as s:
        uncached = await together(s.engine.generator)
    async with serving() as s:
        cached = await together(s.engine.generator)
        hits = sample(s, "serve_prefix_cache_hits_total")
        system_blocks = len(s.engine.generator.tokenize(SYSTEM, "prompt")) // BLOCK
    assert cached == uncached
    assert hits >= 2 * system_blocks * BLOCK > 0


async def test_admission_keeps_within_the_cache_budget(serving) -> None:
    async with serving() as s:
        per_token = s.engine.generator.model.in_place.bytes_per_token
    budget = 30 * per_token  # room for one short prompt + 20 new tokens (the worst case reserved), not two
    async with serving(kv_cache_bytes=budget, prefix_cache_fraction=0.0, max_new_tokens=32) as s:
        gen = s.engine.generator
        too_big = await s.client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 32})
        assert too_big.status_code == 422 and too_big.json()["error"]["field"] == "max_new_tokens"
        assert "SERVE_KV_CACHE_BYTES" in too_big.json()["error"]["message"]
        params = GenerationParams(max_new_tokens=20, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
        prompts = ("Hello", "Au commencement", "x")
        assert all(len(gen.tokenize(p, "prompt")) <= 10 for p in prompts)
        results = await asyncio.gather(*(generate(gen, p, params) for p in prompts))
        assert [r.completion_tokens for r in results] == [20, 20, 20]
        running_together = s.engine.metrics.registry.get_sample_value(
            "serve_batch_size_bucket", {"model": "generator", "phase": "decode", "le": "1.0"}
        )
        total = s.engine.metrics.registry.get_sample_value(
            "serve_batch_size_count", {"model": "generator", "phase": "decode"}
        )
        assert running_together == total  # one at a time: the budget held the others in the queue
        assert 0.0 <= sample(s, "serve_kv_cache_usage_perc") <= 1.0


async def test_every_slot_is_released_after_finished_cancelled_and_failed_sequences(serving, monkeypatch) -> None:
    async with serving(prefix_cache_fraction=0.0) as s:
        gen = s.engine.generator
        decoder = gen.model.in_place
        assert decoder is not None
        await asyncio.gather(*(generate(gen, p) for p in ("Hello", "Au commencement", "x", SYSTEM)))
        handle = gen.scheduler.submit(
            [gen.sequence(gen.tokenize("Hello", "prompt"), GenerationParams(max_new_tokens=30, ignore_eos=True))],
            None, "prompt",
        )
        events = handle.events()
        await anext(events)
        handle.cancel()
        original, calls = decoder.step, []

        def failing(*args: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("device lost")
            return original(*args)

        monkeypatch.setattr(decoder, "step", failing)
        failed = await s.client.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 10, "ignore_eos": True})
        assert failed.json()["error"]["type"] == "inference_failed"
        for _ in range(100):  # the worker drops the cancelled row at its next step
            if decoder.buffers.in_use == 0:
                break
            await asyncio.sleep(0.02)
        assert decoder.buffers.in_use == 0 and decoder.buffers.cached_tokens == 0


def test_slots_are_lowest_first_and_a_released_slot_reads_zero() -> None:
    buffers = SlotBuffers(n_layers=1, n_kv_heads=2, d_head=8, slots=4, capacity=10)
    assert buffers.capacity == 256 and buffers.slot_bytes == 2 * 256 * 8 * 4
    a, b = buffers.acquire(), buffers.acquire()
    assert (a, b) == (0, 1)
    buffers.buffers[0][a, :, :5] = 1.0
    buffers.lengths[a] = 5
    buffers.release(a)
    buffers.release(a)  # idempotent
    assert buffers.acquire() == 0 and not buffers.buffers[0][0].any()  # its pages went back: zeros
    assert buffers.in_use == 2


def test_the_prefix_store_matches_tokens_exactly_and_evicts_leaves_first() -> None:
    buffers = SlotBuffers(n_layers=1, n_kv_heads=1, d_head=4, slots=2, capacity=4 * BLOCK)
    per_token = bytes_per_token(1, 1, 4)
    store = PrefixCache(max_bytes=3 * BLOCK * per_token, block_bytes=BLOCK * per_token)
    first = list(range(3 * BLOCK))
    slot = buffers.acquire()
    for buffer in buffers.buffers:
        buffer[slot, :, : len(first)] = np.arange(len(first), dtype=np.float32)[None, :, None]
    store.remember(first, slot, buffers)
    assert len(store.nodes) == 3
    other = buffers.acquire()
    assert store.reuse(first, other, buffers) == 2 * BLOCK  # the last token is always computed: 2 whole blocks
    assert buffers.lengths[other] == 2 * BLOCK
    assert np.array_equal(buffers.buffers[0][other, 0, : 2 * BLOCK, 0], np.arange(2 * BLOCK, dtype=np.float32))
    changed = [*first[:BLOCK], -1, *first[BLOCK + 1 :]]
    assert store.reuse(changed, other, buffers) == BLOCK  # one token differs in the second block
    # A new prompt's block needs room: the least recently used leaf goes (the old third block), never a parent.
    fresh = [7] * (BLOCK + 1)
    store.remember(fresh, slot, buffers)
    assert len(store.nodes) == 3 and store.reuse([*first, 1], other, buffers) == 2 * BLOCK


async def test_the_in_place_cache_gives_the_appended_caches_tokens_and_logprobs(
    serving, make_settings: Callable[..., Settings], tiny_artifacts: Path
) -> None:
    """The same tiny generator exported both ways (model/export/tiny.py builds it from one seed): greedy tokens
    equal, logprobs within float32 rounding (two attention kernels sum in different orders)."""
    prompts = ["Hello", SYSTEM + "Then light.", "Café 東京 🙂"]
    async with serving() as s:
        in_place = [tokens_and_logprobs(await generate(s.engine.generator, p)) for p in prompts]
    async with serve(make_settings(artifacts_dir=tiny_artifacts)) as s:
        gen = s.engine.generator
        assert gen is not None and gen.model.in_place is None
        appended = [tokens_and_logprobs(await generate(gen, p)) for p in prompts]
    for ours, theirs in zip(in_place, appended, strict=True):
        assert [t for t, _, _ in ours] == [t for t, _, _ in theirs]
        differences = [abs(a - b) for (_, a, x), (_, b, y) in zip(ours, theirs, strict=True)
                       for a, b in [(a, b), *zip(x, y, strict=True)] if a is not None and b is not None]
        assert max(differences) < 1e-4, max(differences)
