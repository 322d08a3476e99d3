"""Batched greedy and beam search on the tiny translator: same results alone or batched."""

import asyncio
import dataclasses
import itertools

from service.engine.tasks.generation.decoding import GenerationParams
from service.engine.tasks.translation.beam_search import banned_ngram_tokens
from service.engine.tasks.translation.decoding import (
    TranslationParams,
    TranslationPiece,
    TranslationResult,
)
from service.engine.tasks.translation.service import TranslationJob, TranslationService
from service.engine.tokens.sampling import SamplingParams

TEXTS = ["In the beginning God created the heavens.", "A dull story.", "Fellow citizens, café 東京!", "Hi"]


async def translate(tr: TranslationService, texts: list[str], params: TranslationParams) -> list[TranslationResult]:
    return await (await tr.submit(TranslationJob(texts, ["text"] * len(texts), params))).results()


def summary(results: list[TranslationResult]) -> list[list[tuple[tuple[int, ...], float]]]:
    return [[(tuple(h.token_ids), round(h.score, 4)) for h in r.hypotheses] for r in results]


async def test_batched_equals_alone_for_greedy_and_beams(serving) -> None:
    settings = [
        TranslationParams(num_beams=1, max_new_tokens=10),
        TranslationParams(num_beams=4, n_best=3, max_new_tokens=10),
    ]
    async with serving(max_batch_size=4) as s:  # room for one request of 4 beams at a time
        alone = [summary(await translate(s.engine.translator, [t], p)) for p in settings for t in TEXTS]
    async with serving(max_batch_size=32) as s:
        together = [summary(await translate(s.engine.translator, TEXTS, p)) for p in settings]
        concurrent = await asyncio.gather(*(translate(s.engine.translator, [t], p) for p in settings for t in TEXTS))
    assert [r for rs in together for r in rs] == [r[0] for r in alone]
    assert [summary(r) for r in concurrent] == alone


async def test_streamed_sequence_beside_a_batch_gets_its_own_tokens(serving) -> None:
    """A stream that shares decode steps with other requests (greedy and beams) gets exactly its tokens."""
    params = TranslationParams(num_beams=1, max_new_tokens=10)
    async with serving(max_batch_size=32) as s:
        tr = s.engine.translator
        (alone,) = await translate(tr, [TEXTS[0]], params)

        async def stream() -> list[TranslationPiece | TranslationResult]:
            job = TranslationJob([TEXTS[0]], ["text"], dataclasses.replace(params, stream=True))
            return [event async for event in (await tr.submit(job)).events()]

        streamed, *_ = await asyncio.gather(
            stream(), translate(tr, TEXTS, params), translate(tr, TEXTS[1:], TranslationParams(num_beams=3))
        )
    *events, result = streamed
    assert isinstance(result, TranslationResult) and summary([result]) == summary([alone])
    pieces = [p for p in events if isinstance(p, TranslationPiece)]
    assert len(pieces) == len(events)
    assert [p.id for p in pieces] == list(alone.hypotheses[0].token_ids)
    assert "".join(p.text for p in pieces) == alone.hypotheses[0].text


async def test_beam_search_returns_sorted_distinct_hypotheses(served) -> None:
    (result,) = await translate(
        served.engine.translator, [TEXTS[0]], TranslationParams(num_beams=5, n_best=5, max_new_tokens=8)
    )
    scores = [h.score for h in result.hypotheses]
    assert len(result.hypotheses) == 5 and scores == sorted(scores, reverse=True)
    assert len({tuple(h.token_ids) for h in result.hypotheses}) == 5


async def test_encoder_runs_once_per_source(served) -> None:
    tr = served.engine.translator
    calls = {"encoder": 0, "decoder": 0}
    for role, session in (("encoder", tr.model.encoder), ("decoder", tr.model.decoder)):
        original = session.run

        def counting(*args, _role=role, _run=original, **kwargs):
            calls[_role] += 1
            return _run(*args, **kwargs)

        session.run = counting
    await translate(tr, TEXTS[:2], TranslationParams(num_beams=3, max_new_tokens=9))
    assert calls["encoder"] == 1  # both sources, once
    assert 1 < calls["decoder"] <= 9  # one call per step: KV cache, no prefix recompute


def test_no_repeat_ngram_bans() -> None:
    assert banned_ngram_tokens([1, 2, 3, 1, 2], 3) == [3]
    assert banned_ngram_tokens([1, 2, 3], 0) == []
    assert banned_ngram_tokens([5, 5], 1) == [5, 5]


async def test_no_repeat_ngram_size_holds(served) -> None:
    params = TranslationParams(num_beams=2, max_new_tokens=20, no_repeat_ngram_size=2)
    (result,) = await translate(served.engine.translator, [TEXTS[0]], params)
    tokens = result.hypotheses[0].token_ids
    bigrams = list(itertools.pairwise(tokens))
    assert len(bigrams) == len(set(bigrams))


async def test_beam_candidates_are_enough_under_a_heavy_ban(served) -> None:
    """Beam search ranks each row's 2 * num_beams + (its banned tokens) best tokens: with every earlier
    token banned (n = 1) that gives what ranking the whole vocabulary gives."""
    tr = served.engine.translator
    params = TranslationParams(num_beams=3, n_best=3, max_new_tokens=16, no_repeat_ngram_size=1)
    narrow = summary(await translate(tr, TEXTS, params))
    head = tr.model.top_logprobs
    tr.model.top_logprobs = lambda logits, k: head(logits, logits.shape[-1])
    try:
        assert summary(await translate(tr, TEXTS, params)) == narrow
    finally:
        tr.model.top_logprobs = head
    results = await translate(tr, TEXTS, params)
    assert all(len(set(h.token_ids)) == len(h.token_ids) for r in results for h in r.hypotheses)


async def test_io_binding_path_gives_the_same_results(serving) -> None:
    """The CUDA code path (device-resident KV and cross K/V via IOBinding), exercised on CPU."""
    params = TranslationParams(num_beams=3, n_best=2, max_new_tokens=8)
    results = []
    for io_binding in (False, True):
        async with serving(io_binding=io_binding, max_batch_size=8) as s:
            batched = await asyncio.gather(*(translate(s.engine.translator, [t], params) for t in TEXTS))
            results.append(summary([r for rs in batched for r in rs]))
            gen = s.engine.generator
            seq = gen.sequence(
                gen.tokenize("Hello", "prompt"), GenerationParams(8, SamplingParams(seed=1), ignore_eos=True)
            )
            results[-1].append([t.id for t in (await gen.scheduler.submit([seq], None, "prompt").result()).tokens])
    assert results[0] == results[1]
