"""Translation through the shared decoding core: chooser features in greedy mode, stop strings, the end
token outside the output, and metrics that count output tokens rather than beam rows."""

import asyncio
import dataclasses

from service.engine.tasks.translation.decoding import TranslationParams, TranslationPiece, TranslationResult
from service.engine.tasks.translation.service import TranslationJob, TranslationService
from service.engine.tokens.sampling import SamplingParams

TEXT = "In the beginning God created the heavens."


async def translate(tr: TranslationService, texts: list[str], params: TranslationParams) -> list[TranslationResult]:
    return await (await tr.submit(TranslationJob(texts, ["text"] * len(texts), params))).results()


async def test_greedy_translation_takes_logit_bias_and_penalties(served) -> None:
    tr = served.engine.translator
    plain = TranslationParams(num_beams=1, max_new_tokens=8, no_repeat_ngram_size=0)
    (base,) = await translate(tr, [TEXT], plain)
    tokens = base.hypotheses[0].token_ids
    forced = next(t for t in range(10, 100) if t not in tokens)
    bias = SamplingParams(temperature=0.0, logit_bias={forced: 1000.0})
    biased_params = TranslationParams(num_beams=1, max_new_tokens=4, no_repeat_ngram_size=0, sampling=bias)
    (biased,) = await translate(tr, [TEXT], biased_params)
    assert biased.hypotheses[0].token_ids[0] == forced
    # A large repetition penalty on the same bias: the forced token once, then never again.
    both = SamplingParams(temperature=0.0, logit_bias={forced: 5.0}, repetition_penalty=100.0)
    (penalized,) = await translate(tr, [TEXT], TranslationParams(num_beams=1, max_new_tokens=6, sampling=both))
    assert penalized.hypotheses[0].token_ids.count(forced) <= 1 and biased.hypotheses[0].token_ids == [forced] * 4


async def test_end_token_is_not_an_output_token(served) -> None:
    tr = served.engine.translator
    eos = tr.artifact.special_tokens["eos"]
    first = SamplingParams(temperature=0.0, logit_bias={eos: 1000.0})
    whole = TranslationParams(num_beams=1, sampling=first)
    streamed = TranslationParams(num_beams=1, stream=True, sampling=first)
    for params in (whole, streamed):
        events = [e async for e in (await tr.submit(TranslationJob([TEXT], ["text"], params))).events()]
        (result,) = events  # no piece: the end token is the only token drawn
        assert isinstance(result, TranslationResult) and result.hypotheses[0].token_ids == []
    (beams,) = await translate(tr, [TEXT], TranslationParams(num_beams=3, n_best=3, max_new_tokens=12))
    assert all(eos not in h.token_ids for h in beams.hypotheses)


async def test_stop_strings_cut_greedy_translations(served) -> None:
    tr = served.engine.translator
    textless = dict.fromkeys(tr.artifact.special_tokens.values(), -1000.0)  # the tiny model likes them
    no_end = SamplingParams(temperature=0.0, logit_bias=textless)
    params = TranslationParams(num_beams=1, max_new_tokens=12, no_repeat_ngram_size=0, sampling=no_end)
    (whole,) = await translate(tr, [TEXT], params)
    text = whole.hypotheses[0].text
    stop = text.strip()[3:6]
    assert stop, (text, whole.hypotheses[0].token_ids)
    (cut,) = await translate(tr, [TEXT], dataclasses.replace(params, stop=(stop,)))
    assert stop not in cut.hypotheses[0].text and text.startswith(cut.hypotheses[0].text)
    assert len(cut.hypotheses[0].token_ids) < len(whole.hypotheses[0].token_ids)
    job = TranslationJob([TEXT], ["text"], dataclasses.replace(params, stop=(stop,), stream=True))
    streamed = [e async for e in (await tr.submit(job)).events()]
    *pieces, result = streamed
    assert all(isinstance(p, TranslationPiece) and p.logprob is not None for p in pieces)
    assert "".join(p.text for p in pieces) + result.tail == cut.hypotheses[0].text == result.hypotheses[0].text


async def test_generated_tokens_count_output_tokens_not_beam_rows(served) -> None:
    tr = served.engine.translator
    registry = served.engine.metrics.registry

    def count(name: str) -> float:
        return registry.get_sample_value(name, {"model": "translator"}) or 0.0

    before, ttft = count("serve_generated_tokens_total"), count("serve_time_to_first_token_seconds_count")
    results = await asyncio.gather(
        translate(tr, [TEXT, "A dull story."], TranslationParams(num_beams=4, n_best=2, max_new_tokens=10)),
        translate(tr, ["Hi"], TranslationParams(num_beams=1, max_new_tokens=10)),
    )
    outputs = sum(len(h.token_ids) for rs in results for r in rs for h in r.hypotheses)
    assert count("serve_generated_tokens_total") - before == outputs
    assert count("serve_time_to_first_token_seconds_count") - ttft == 3
