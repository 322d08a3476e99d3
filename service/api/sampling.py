"""Every protocol's sampling fields -> the engine's SamplingParams, in one place: the native routes and
OpenAI's share their names; TGI's parameters follow TGI's own rules; /v1/translate samples only when asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.engine.tasks.translation.decoding import TranslationParams
from service.engine.tokens.sampling import DEFAULTABLE, SamplingParams

if TYPE_CHECKING:
    from service.api.native.schemas import GenerateRequest, TranslateRequest
    from service.api.openai.schemas import OpenAISampling
    from service.api.tgi.schemas import TgiParameters

# The TranslationParams fields that /v1/translate's request carries as they are; sampling and stop are built.
TRANSLATION_AS_GIVEN = frozenset(
    {"num_beams", "n_best", "length_penalty", "max_new_tokens", "no_repeat_ngram_size", "return_attention", "stream"}
)


def sampling_params(body: GenerateRequest | OpenAISampling | TranslateRequest, **more: Any) -> SamplingParams:
    """The sampling options /v1/generate, the OpenAI routes and /v1/translate (with do_sample) share, and
    `more` of the OpenAI routes' own."""
    return SamplingParams(
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        **more,
    )


def sampling_given(body: GenerateRequest | OpenAISampling) -> frozenset[str]:
    """The sampling settings the client set (the others take the model's defaults, where it has some)."""
    return frozenset(body.model_fields_set & set(DEFAULTABLE))


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def tgi_sampling(p: TgiParameters) -> SamplingParams:
    """TGI samples when asked (`do_sample`) or when a sampling field is set; greedy otherwise."""
    sampled = p.do_sample or any(x is not None for x in (p.temperature, p.top_k, p.top_p))
    return SamplingParams(
        temperature=(p.temperature or 1.0) if sampled else 0.0,
        top_k=p.top_k or 0,
        top_p=p.top_p or 1.0,
        repetition_penalty=p.repetition_penalty or 1.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        seed=p.seed,
    )


def translation_params(body: TranslateRequest) -> TranslationParams:
    sampling = None
    if body.do_sample:
        sampling = sampling_params(body)
    elif body.repetition_penalty != 1.0:
        sampling = SamplingParams(temperature=0.0, repetition_penalty=body.repetition_penalty)
    given = body.model_dump(include=set(TRANSLATION_AS_GIVEN))
    return TranslationParams(sampling=sampling, stop=stop_strings(body.stop), **given)
