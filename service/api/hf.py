"""Hugging Face protocols, so `huggingface_hub.InferenceClient` (and TGI/TEI clients) work as they are:

- TGI: `POST /generate`, `POST /generate_stream` (its SSE token/details events), `GET /info`;
- `POST /` and `POST /models/{name}` dispatch by the model's task, taking the Inference API's
  `{"inputs": ..., "parameters": ...}`: text-generation (TGI's shape; a list back, or a stream),
  text-classification (`[[{label, score}, ...]]`), translation (`[{translation_text}]`), and for an
  embedding model feature-extraction and sentence-similarity (service/api/hf_embeddings.py). A request
  shaped for a task the model does not serve is a 422 naming the model's tasks (service/api/hf_tasks.py);
  `POST /models/{name}/pipeline/{task}` names the task in the URL, as the Inference API does.
  `POST /` is the default model (the generator where it is loaded); `GET /models/{name}/info` and
  `/models/{name}/health` answer for one model; `/info` adds TEI's fields (service/api/tei.py).

Unknown fields in `parameters` are ignored, as TGI and the Inference API do; a known one that this
server cannot honour (grammar, watermark, best_of > 1, typical_p, adapters) is a 422.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import fields_as_sent
from service.api.schemas import (
    MAX_SEED,
    MAX_TOP_K,
    TRUNCATE_DOC,
    AnyCaseTruncationSide,
    Lenient,
    NonEmptyText,
    Text,
    TranslateRequest,
    truncation_side,
    validated,
)
from service.api.hf_embeddings import (
    EmbeddingModelRequest,
    FeatureExtractionRequest,
    SentenceSimilarityRequest,
    feature_extraction,
    sentence_similarity,
)
from service.api.hf_tasks import check_task, served_tasks, wrong_task
from service.api.served import Service, service_named, services
from service.api.sse import event_stream, sse, stream_doc
from service.api.tei import tei_info
from service.api.translate import translation_params
from contract.kinds import TASKS
from service.engine.classification import ClassificationJob, ClassificationService
from service.engine.embedding import EmbeddingService
from service.engine.engine import Engine
from service.engine.generation import GenerationResult, TokenEvent
from service.engine.generation_service import GenerationHandle, GenerationJob, GenerationService
from service.engine.sampling import SamplingParams
from service.engine.scoring import TokenScore
from service.engine.translation_service import TranslationJob, TranslationService

router = APIRouter(tags=["hugging face"])

FINISH = {"eos": "eos_token", "stop": "stop_sequence", "length": "length"}
MAX_STOP = 4


class TgiParameters(Lenient):
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, gt=0.0, le=10.0)
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K, description="beyond the vocabulary: all")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    do_sample: bool = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Annotated[list[NonEmptyText], Field(max_length=MAX_STOP)] = Field(default_factory=list)
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    top_n_tokens: int | None = Field(None, ge=0, le=5)
    truncate: int | None = Field(None, ge=1, description="keep only the last `truncate` prompt tokens")
    # Accepted only at their neutral values:
    best_of: int | None = Field(None, ge=1, le=1)
    typical_p: float | None = Field(None, ge=1.0, le=1.0, description="typical decoding is not supported")
    # bool, not Literal[False]: a literal compares by equality and would take 0 for false.
    watermark: bool = Field(False, json_schema_extra={"const": False}, description="not supported: false only")
    grammar: None = None
    adapter_id: None = None

    @field_validator("watermark")
    @classmethod
    def _no_watermark(cls, value: bool) -> bool:
        if value:
            raise ValueError("watermarking is not supported")
        return value


class TgiRequest(Lenient):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"inputs": "In the beginning", "parameters": {"max_new_tokens": 16, "do_sample": True, "seed": 42}}
            ]
        }
    )

    inputs: NonEmptyText
    parameters: TgiParameters = Field(default_factory=TgiParameters)
    stream: bool = False


class TextPair(Lenient):
    text: Text
    text_pair: Text


class ClassificationParameters(Lenient):
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K)
    function_to_apply: Literal["softmax"] | None = Field(None, description="the classifier's scores are a softmax")
    truncate: bool = Field(False, description=TRUNCATE_DOC)
    truncation_direction: AnyCaseTruncationSide = "right"


class ClassificationRequest(Lenient):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"inputs": "A wonderful, moving film.", "parameters": {"top_k": 2}}]}
    )

    inputs: Text | TextPair | Annotated[list[Text | TextPair], Field(min_length=1)]
    parameters: ClassificationParameters = Field(default_factory=ClassificationParameters)


_TRANSLATE = TranslateRequest.model_fields


class TranslationGenerateParameters(Lenient):
    """Passed on to /v1/translate's request (its defaults apply); its bounds, stated here too, so that the
    OpenAPI document has them."""

    max_new_tokens: Annotated[int | None, *_TRANSLATE["max_new_tokens"].metadata] = None
    num_beams: Annotated[int | None, *_TRANSLATE["num_beams"].metadata] = None
    length_penalty: Annotated[float | None, *_TRANSLATE["length_penalty"].metadata] = None
    no_repeat_ngram_size: Annotated[int | None, *_TRANSLATE["no_repeat_ngram_size"].metadata] = None


class TranslationParameters(Lenient):
    src_lang: Literal["en", "eng_Latn", "en_XX", "English"] | None = None
    tgt_lang: Literal["fr", "fra_Latn", "fr_XX", "French"] | None = None
    generate_parameters: TranslationGenerateParameters = Field(default_factory=TranslationGenerateParameters)


class TranslationRequest(Lenient):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"inputs": "The Lord is my shepherd.", "parameters": {"generate_parameters": {"num_beams": 4}}}]
        }
    )

    inputs: Text | Annotated[list[Text], Field(min_length=1)]
    parameters: TranslationParameters = Field(default_factory=TranslationParameters)


# The engine's option names (and /v1/translate's, which the Inference API's translation passes through)
# as the client sent them, so that errors name the client's field.
TGI_FIELDS = {name: f"parameters.{name}" for name in TgiParameters.model_fields}
TRANSLATION_FIELDS = {"text": "inputs"} | {
    name: f"parameters.generate_parameters.{name}" for name in TranslationGenerateParameters.model_fields
}


# --- text generation (TGI) ----------------------------------------------------------------------


def _job(body: TgiRequest, model: str) -> GenerationJob:
    p = body.parameters
    sampled = p.do_sample or any(x is not None for x in (p.temperature, p.top_k, p.top_p))  # as TGI decides
    sampling = SamplingParams(
        temperature=(p.temperature or 1.0) if sampled else 0.0,
        top_k=p.top_k or 0,
        top_p=p.top_p or 1.0,
        repetition_penalty=p.repetition_penalty or 1.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        seed=p.seed,
    )
    return GenerationJob(
        [body.inputs],
        ["inputs"],
        max_new_tokens=p.max_new_tokens,
        sampling=sampling,
        stop=tuple(p.stop),
        logprobs=p.top_n_tokens or 0,
        truncate=p.truncate,
        score_prompts=0 if p.details and p.decoder_input_details else None,
        model=model,
    )


async def _submit(generator: GenerationService, body: TgiRequest) -> GenerationHandle:
    with fields_as_sent(TGI_FIELDS):
        return await generator.submit(_job(body, generator.name))


def _token(event: TokenEvent) -> dict[str, Any]:
    return {"id": event.id, "text": event.text, "logprob": event.logprob, "special": event.special}


def _top_tokens(event: TokenEvent) -> list[dict[str, Any]]:
    return [{"id": t.id, "text": t.text, "logprob": t.logprob, "special": False} for t in event.top_logprobs or []]


def _prefill(generator: GenerationService, scores: list[list[TokenScore]] | None) -> list[dict[str, Any]]:
    (prompt,) = scores or [[]]
    return [{"id": s.id, "text": generator.tokenizer.decode([s.id]), "logprob": s.logprob} for s in prompt]


async def _tgi_generate(generator: GenerationService, body: TgiRequest, request: Request) -> dict[str, Any]:
    p = body.parameters
    handle = await _submit(generator, body)
    prefill = _prefill(generator, await unless_disconnected(request, handle.prompt_scores()))
    result: GenerationResult = await unless_disconnected(request, handle.result())
    text = (body.inputs + result.text) if p.return_full_text else result.text
    answer: dict[str, Any] = {"generated_text": text}
    if p.details:
        answer["details"] = {
            "finish_reason": FINISH[result.finish_reason],
            "generated_tokens": result.completion_tokens,
            "seed": result.seed if p.seed is not None or p.do_sample else None,
            "prefill": prefill,
            "tokens": [_token(t) for t in result.tokens],
            "top_tokens": [_top_tokens(t) for t in result.tokens] if p.top_n_tokens else None,
            "best_of_sequences": None,
        }
    return answer


def _tgi_error(type: str, message: str, field: str | None) -> str:
    """TGI's in-stream error event: `{"error": message, "error_type": kind}`."""
    return sse({"error": message, "error_type": type, "field": field})


async def _tgi_stream(generator: GenerationService, body: TgiRequest, request: Request) -> Any:
    p = body.parameters
    handle = await _submit(generator, body)
    (ids,) = handle.prompt_ids
    events: AsyncIterator[TokenEvent | GenerationResult] = handle.events()
    held: list[TokenEvent] = []  # one token is held back: the last one goes out with the text and details

    def render(event: TokenEvent | GenerationResult) -> str:
        if isinstance(event, TokenEvent):
            out = _tgi_chunk(held[0], p, None, None) if held else ""
            held[:] = [event]
            return out
        text = (body.inputs + event.text) if p.return_full_text else event.text
        details = {
            "finish_reason": FINISH[event.finish_reason],
            "generated_tokens": event.completion_tokens,
            "seed": event.seed,
            "input_length": len(ids),
        }
        # An end token as the first token: no token event came (the end token is none); TGI sends it.
        last = held[0] if held else TokenEvent(0, generator.model.eos, event.tail, True)
        return _tgi_chunk(last, p, text, details)

    return await event_stream(request, events, render, _tgi_error)


def _tgi_chunk(token: TokenEvent, p: TgiParameters, text: str | None, details: dict[str, Any] | None) -> str:
    chunk = {
        "index": token.index + 1,
        "token": _token(token),
        "top_tokens": _top_tokens(token) if p.top_n_tokens else None,
        "generated_text": text,
        "details": details,
    }
    return sse(chunk)


async def _tgi(generator: GenerationService, body: TgiRequest, request: Request, as_list: bool) -> Any:
    if body.stream:
        return await _tgi_stream(generator, body, request)
    answer = await _tgi_generate(generator, body, request)
    return [answer] if as_list else answer


def _generator(engine: Engine) -> GenerationService:
    return engine.require_generator()


TGI_STREAM_DOC = stream_doc("TGI's `data:` token events, the last one with `generated_text` and `details`")


@router.post("/generate", summary="TGI: generate text", responses=TGI_STREAM_DOC)
async def tgi_generate(body: TgiRequest, engine: EngineDep, request: Request) -> Any:
    return await _tgi(_generator(engine), body, request, as_list=False)


@router.post("/generate_stream", summary="TGI: generate text as Server-Sent Events", responses=TGI_STREAM_DOC)
async def tgi_generate_stream(body: TgiRequest, engine: EngineDep, request: Request) -> Any:
    return await _tgi(_generator(engine), body.model_copy(update={"stream": True}), request, as_list=False)


# --- classification and translation (Inference API shapes) ----------------------------------------


async def _classify(engine: Engine, model: str, body: ClassificationRequest, request: Request) -> Any:
    items = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    inputs = [x if isinstance(x, str) else (x.text, x.text_pair) for x in items]
    fields = ["inputs"] if not isinstance(body.inputs, list) else [f"inputs[{i}]" for i in range(len(items))]
    p = body.parameters
    job = ClassificationJob(
        inputs, fields, truncate=p.truncate, truncation_direction=truncation_side(p.truncation_direction), model=model
    )
    handle = await engine.submit(job)
    results = await unless_disconnected(request, handle.results())
    ranked = [sorted(r.scores.items(), key=lambda kv: -kv[1])[: p.top_k] for r in results]
    return [[{"label": label, "score": score} for label, score in labels] for labels in ranked]


async def _translate(translator: TranslationService, body: TranslationRequest, request: Request) -> Any:
    texts = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    fields = ["inputs"] if not isinstance(body.inputs, list) else [f"inputs[{i}]" for i in range(len(texts))]
    chosen = body.parameters.generate_parameters.model_dump(exclude_none=True)
    params = translation_params(validated(TranslateRequest, {"text": texts, **chosen}, TRANSLATION_FIELDS))
    with fields_as_sent(TRANSLATION_FIELDS):
        handle = await translator.submit(TranslationJob(texts, fields, params))
    results = await unless_disconnected(request, handle.results())
    return [{"translation_text": r.hypotheses[0].text} for r in results]


# The body of POST / and POST /models/{name}, by the model's task (service/api/openapi.py documents it).
DISPATCH_BODIES: dict[str, type[BaseModel]] = {
    "generation": TgiRequest,
    "classification": ClassificationRequest,
    "translation": TranslationRequest,
    "embedding": EmbeddingModelRequest,
}


async def _dispatch(engine: Engine, service: Service, payload: Any, request: Request, task: str | None = None) -> Any:
    """`task`: the Inference API task the URL names (one the model serves); else the body's shape tells."""
    check_task(service.name, served_tasks(service.artifact.task), payload)
    if isinstance(service, GenerationService):
        return await _tgi(service, validated(TgiRequest, payload), request, as_list=True)
    if isinstance(service, ClassificationService):
        return await _classify(engine, service.name, validated(ClassificationRequest, payload), request)
    if isinstance(service, EmbeddingService):
        inputs = payload.get("inputs") if isinstance(payload, dict) else None
        if task == "sentence-similarity" or (task is None and isinstance(inputs, dict)):
            body = validated(SentenceSimilarityRequest, payload)
            return await sentence_similarity(engine, service.name, body, request)
        return await feature_extraction(engine, service.name, validated(FeatureExtractionRequest, payload), request)
    return await _translate(service, validated(TranslationRequest, payload), request)


_PAYLOAD = Body(
    description="`{inputs, parameters}`: TGI's generate request for a generator, the Inference API's "
    "text-classification, translation, feature-extraction or sentence-similarity request for the others"
)


@router.post("/", summary="The default model (the generator where loaded), by its task", responses=TGI_STREAM_DOC)
async def root(engine: EngineDep, request: Request, payload: Annotated[dict[str, Any], _PAYLOAD]) -> Any:
    return await _dispatch(engine, service_named(engine, None), payload, request)


@router.post(
    "/models/{name}", summary="One model, by its task (the Inference API's URL shape)", responses=TGI_STREAM_DOC
)
async def by_model(name: str, engine: EngineDep, request: Request, payload: Annotated[dict[str, Any], _PAYLOAD]) -> Any:
    return await _dispatch(engine, service_named(engine, name, field="name"), payload, request)


@router.post(
    "/models/{name}/pipeline/{task}",
    summary="One model, for the Inference API task the URL names (422 naming the model's tasks for another)",
    responses=TGI_STREAM_DOC,
)
async def by_model_task(
    name: str, task: str, engine: EngineDep, request: Request, payload: Annotated[dict[str, Any], _PAYLOAD]
) -> Any:
    service = service_named(engine, name, field="name")
    served = served_tasks(service.artifact.task)
    if task not in served:
        raise wrong_task(name, served, task, "task")
    return await _dispatch(engine, service, payload, request, task)


# --- info and health ------------------------------------------------------------------------------


def _info(engine: Engine, service: Service) -> dict[str, Any]:
    a = service.artifact
    settings = engine.settings
    info = engine.models[service.name]
    provider = next(iter(info.sessions.values())).provider
    return {
        "model_id": service.name,
        "model_sha": None,
        "model_dtype": "float32",
        "model_device_type": "cuda" if provider.startswith("CUDA") else "cpu",
        "model_pipeline_tag": TASKS[a.task].pipeline_tag,
        "max_concurrent_requests": settings.max_queue_size,
        "max_best_of": 1,
        "max_stop_sequences": MAX_STOP,
        "max_input_tokens": min(settings.max_input_tokens, a.max_positions - 1),
        "max_total_tokens": a.max_positions,
        "max_client_batch_size": settings.max_queue_size,
        "validation_workers": 1,
        "router": "transformer-serving",
        "version": "0.1.0",
        "sha": None,
        "docker_label": None,
        "models": sorted(services(engine)),
    }


@router.get("/info", summary="TGI's /info for the default model, with TEI's fields for the default embedder")
async def info(engine: EngineDep) -> dict[str, Any]:
    return _info(engine, service_named(engine, None)) | tei_info(engine)


@router.get("/models/{name}/info", summary="TGI's /info for one model (with TEI's fields for an encoder)")
async def model_info(name: str, engine: EngineDep) -> dict[str, Any]:
    service = service_named(engine, name, field="name")
    encoder = service if isinstance(service, EmbeddingService | ClassificationService) else None
    return _info(engine, service) | (tei_info(engine, encoder) if encoder else {})


def _hub_model(service: Service) -> dict[str, Any]:
    tasks = served_tasks(service.artifact.task)
    return {"id": service.name, "modelId": service.name, "pipeline_tag": tasks[0], "tags": list(tasks),
            "private": False, "library_name": "transformer-serving"}  # fmt: skip


@router.get("/api/models", summary="The Hub's model list: each served model and its pipeline tag")
async def hub_models(engine: EngineDep) -> list[dict[str, Any]]:
    return [_hub_model(service) for service in services(engine).values()]


@router.get("/api/models/{name}", summary="The Hub's model info for one served model")
async def hub_model(name: str, engine: EngineDep) -> dict[str, Any]:
    return _hub_model(service_named(engine, name, field="name"))


@router.get("/models/{name}/health", summary="200 once this model is ready (InferenceClient.health_check)")
async def model_health(name: str, engine: EngineDep) -> JSONResponse:
    service_named(engine, name, field="name")
    ready = engine.ready and not engine.draining and engine.failure is None
    return JSONResponse({"status": "ok" if ready else "unavailable"}, status_code=200 if ready else 503)
