"""Hugging Face protocols, so `huggingface_hub.InferenceClient` (and TGI/TEI clients) work as they are:

- TGI's `GET /info` (its generate routes: service/api/tgi/routes.py);
- `POST /models/{name}` answers in the model's task, taking the Inference API's
  `{"inputs": ..., "parameters": ...}`: text-generation (TGI's shape; a list back, or a stream),
  text-classification (`[[{label, score}, ...]]`), translation (`[{translation_text}]`), and for an
  embedding model feature-extraction and sentence-similarity (service/api/hf/embeddings.py). A request
  that names a task the model does not serve is a 422 naming the model's tasks (service/api/hf/tasks.py);
  `POST /models/{name}/pipeline/{task}` names the task in the URL, as the Inference API does.
  `POST /` is the default model (the generator where it is loaded) for a body that names its task: a body
  that several tasks' clients send alike is a 422 there, naming the models' URLs. An `Accept` that takes
  neither JSON nor events (text_to_image's `image/png`) is a 406. `GET /models/{name}/info` and
  `/models/{name}/health` answer for one model; `/info` adds TEI's fields (service/api/tei/routes.py).

Unknown fields in `parameters` are ignored, as TGI and the Inference API do; a known one that this
server cannot honour (watermark, best_of > 1, typical_p, adapters) is a 422. A key of another task's
`parameters` is that task's signal (service/api/hf/tasks.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from contract.kinds import TASKS
from service.api.asgi.lean_route import LeanRoute
from service.api.deps import EngineDep, unless_disconnected
from service.api.errors import ApiError, fields_as_sent
from service.api.hf.embeddings import (
    EmbeddingModelRequest,
    FeatureExtractionRequest,
    SentenceSimilarityRequest,
    feature_extraction,
    sentence_similarity,
)
from service.api.hf.tasks import (
    check_accept,
    check_root,
    check_task,
    naming_schema,
    served_tasks,
    wrong_task,
)
from service.api.native.schemas import (
    MAX_TOP_K,
    TRUNCATE_DOC,
    AnyCaseTruncationSide,
    Lenient,
    Text,
    TranslateRequest,
    bounded,
    truncation_side,
    validated,
)
from service.api.sampling import translation_params
from service.api.tei.routes import tei_info
from service.api.tgi.routes import TGI_STREAM_DOC, tgi_answer
from service.api.tgi.schemas import MAX_STOP, TgiRequest
from service.engine.capabilities import Capabilities
from service.engine.engine import Engine
from service.engine.registry import record
from service.engine.tasks.classification.service import ClassificationJob
from service.engine.tasks.translation.service import TranslationJob

router = APIRouter(tags=["hugging face"], route_class=LeanRoute)  # large bodies parsed off the event loop


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
        json_schema_extra={
            "examples": [
                {"inputs": "A wonderful, moving film.", "parameters": {"top_k": 2, "function_to_apply": "softmax"}}
            ]
        }
    )

    inputs: Text | TextPair | Annotated[list[Text | TextPair], bounded()]
    parameters: ClassificationParameters = Field(default_factory=lambda: ClassificationParameters())


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
            "examples": [
                {
                    "inputs": "The Lord is my shepherd.",
                    "parameters": {"src_lang": "en", "tgt_lang": "fr", "generate_parameters": {"num_beams": 4}},
                }
            ]
        }
    )

    inputs: Text | Annotated[list[Text], bounded()]
    parameters: TranslationParameters = Field(default_factory=TranslationParameters)


# The engine's option names (and /v1/translate's, which the Inference API's translation passes through)
# as the client sent them, so that errors name the client's field.
TRANSLATION_FIELDS = {"text": "inputs"} | {
    name: f"parameters.generate_parameters.{name}" for name in TranslationGenerateParameters.model_fields
}


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


async def _translate(engine: Engine, translator: Capabilities, body: TranslationRequest, request: Request) -> Any:
    texts = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    fields = ["inputs"] if not isinstance(body.inputs, list) else [f"inputs[{i}]" for i in range(len(texts))]
    chosen = body.parameters.generate_parameters.model_dump(exclude_none=True)
    params = translation_params(validated(TranslateRequest, {"text": texts, **chosen}, TRANSLATION_FIELDS))
    with fields_as_sent(TRANSLATION_FIELDS):
        handle = await engine.submit(TranslationJob(texts, fields, params, translator.name))
    results = await unless_disconnected(request, handle.results())
    return [{"translation_text": r.hypotheses[0].text} for r in results]


def _naming(model: type[BaseModel], task: str) -> dict[str, Any]:
    """`model`'s schema extras, and that the body names its task (what POST / answers: hf_tasks.check_root)."""
    extra = model.model_config.get("json_schema_extra")
    return {**(extra if isinstance(extra, dict) else {}), "allOf": [naming_schema(served_tasks(task))]}


class RootTgiRequest(TgiRequest):
    model_config = ConfigDict(json_schema_extra=_naming(TgiRequest, "generation"))


class RootClassificationRequest(ClassificationRequest):
    model_config = ConfigDict(json_schema_extra=_naming(ClassificationRequest, "classification"))


class RootTranslationRequest(TranslationRequest):
    model_config = ConfigDict(json_schema_extra=_naming(TranslationRequest, "translation"))


class RootEmbeddingModelRequest(EmbeddingModelRequest):
    model_config = ConfigDict(json_schema_extra=_naming(EmbeddingModelRequest, "embedding"))


Answer = Callable[[Engine, Capabilities, Any, Request, str | None], Awaitable[Any]]


@dataclass(frozen=True)
class InferenceForm:
    """How a model of one task answers the Inference API: its body on POST /models/{name}, the same naming
    its task (POST /'s, in the OpenAPI document), and the answer; `task` is the Inference API task the URL
    names (one the model serves), else the body's shape tells."""

    body: type[BaseModel]
    root_body: type[BaseModel]
    answer: Answer


async def _generation(engine: Engine, model: Capabilities, payload: Any, request: Request, task: str | None) -> Any:
    return await tgi_answer(engine, model, validated(TgiRequest, payload), request, as_list=True)


async def _classification(
    engine: Engine, model: Capabilities, payload: Any, request: Request, task: str | None
) -> Any:
    return await _classify(engine, model.name, validated(ClassificationRequest, payload), request)


async def _translation(engine: Engine, model: Capabilities, payload: Any, request: Request, task: str | None) -> Any:
    return await _translate(engine, model, validated(TranslationRequest, payload), request)


async def _embedding(engine: Engine, model: Capabilities, payload: Any, request: Request, task: str | None) -> Any:
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    if task == "sentence-similarity" or (task is None and isinstance(inputs, dict)):
        return await sentence_similarity(engine, model.name, validated(SentenceSimilarityRequest, payload), request)
    return await feature_extraction(engine, model.name, validated(FeatureExtractionRequest, payload), request)


# The Inference API's form of each task that has one (a task without one answers its own routes only).
FORMS: dict[str, InferenceForm] = {
    "generation": InferenceForm(TgiRequest, RootTgiRequest, _generation),
    "classification": InferenceForm(ClassificationRequest, RootClassificationRequest, _classification),
    "translation": InferenceForm(TranslationRequest, RootTranslationRequest, _translation),
    "embedding": InferenceForm(EmbeddingModelRequest, RootEmbeddingModelRequest, _embedding),
}


def _models_by_task(engine: Engine) -> dict[str, list[str]]:
    """Each Inference API task and the served models that answer it, the default first."""
    models: dict[str, list[str]] = {}
    for name, model in engine.served().items():
        for task in served_tasks(model.task):
            models.setdefault(task, []).append(name)
    return models


async def _dispatch(
    engine: Engine, model: Capabilities, payload: Any, request: Request, task: str | None = None
) -> Any:
    form = FORMS.get(model.task)
    if form is None:
        routes = ", ".join(record(model.task).routes)
        message = f"model {model.name!r} ({model.task}) has no Inference API form; it answers {routes}"
        raise ApiError(422, "unsupported_task", message, "name")
    return await form.answer(engine, model, payload, request, task)


TaskCheck = Callable[[str, Sequence[str], Any, Mapping[str, Sequence[str]]], None]


async def _checked_dispatch(engine: Engine, request: Request, payload: Any, name: str | None, check: TaskCheck) -> Any:
    """POST / (`name` None: the default model) and POST /models/{name}: the body checked against the model's
    tasks (`check`), then answered in its task's form."""
    check_accept(request.headers.get("accept"))
    model = engine.resolve(name, field="name")
    check(model.name, served_tasks(model.task), payload, _models_by_task(engine))
    return await _dispatch(engine, model, payload, request)


Route = Callable[..., Awaitable[Any]]


def _dispatch_route(path: str, summary: str, description: str) -> Callable[[Route], Route]:
    """A dispatch route: its body any task's request (_PAYLOAD), its answer JSON or TGI's stream."""
    return router.post(path, summary=summary, description=description, responses=TGI_STREAM_DOC)


_PAYLOAD = Body(
    description="`{inputs, parameters}`: TGI's generate request for a generator, the Inference API's "
    "text-classification, translation, feature-extraction or sentence-similarity request for the others"
)
_WRONG_TASK = "A body (or an `Accept` header) that asks for a task this model does not serve: 422 (406) naming it"
_ROOT = (
    "A body that several tasks' clients send alike (huggingface_hub's `parameters: {}`, or no `parameters`) "
    "is a 422 naming the served models' URLs; one that names another task, a 422 naming it."
)


@_dispatch_route(
    "/",
    "The default model (the generator where loaded), for a body that names its task",
    _ROOT,
)
async def root(engine: EngineDep, request: Request, payload: Annotated[dict[str, Any], _PAYLOAD]) -> Any:
    return await _checked_dispatch(engine, request, payload, None, check_root)


@_dispatch_route(
    "/models/{name}",
    "One model, by its task (the Inference API's URL shape)",
    _WRONG_TASK + "; a body that names no task gets the model's own.",
)
async def by_model(name: str, engine: EngineDep, request: Request, payload: Annotated[dict[str, Any], _PAYLOAD]) -> Any:
    return await _checked_dispatch(engine, request, payload, name, check_task)


@_dispatch_route(
    "/models/{name}/pipeline/{task}",
    "One model, for the Inference API task the URL names (422 naming the model's tasks for another)",
    _WRONG_TASK + ", or one the URL does not name.",
)
async def by_model_task(
    name: str, task: str, engine: EngineDep, request: Request, payload: Annotated[dict[str, Any], _PAYLOAD]
) -> Any:
    check_accept(request.headers.get("accept"))
    model = engine.resolve(name, field="name")
    served = served_tasks(model.task)
    if task not in served:
        raise wrong_task(name, served, task, "task")
    check_task(name, (task,), payload, _models_by_task(engine))
    return await _dispatch(engine, model, payload, request, task)


# --- info and health ------------------------------------------------------------------------------


def _info(engine: Engine, model: Capabilities) -> dict[str, Any]:
    a = model.artifact
    settings = engine.settings
    info = engine.models[model.name]
    provider = next(iter(info.sessions.values())).provider
    return {
        "model_id": model.name,
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
        "models": sorted(engine.served()),
    }


@router.get("/info", summary="TGI's /info for the default model, with TEI's fields for the default embedder")
async def info(engine: EngineDep) -> dict[str, Any]:
    return _info(engine, engine.resolve(None)) | tei_info(engine)


@router.get("/models/{name}/info", summary="TGI's /info for one model (with TEI's fields for an encoder)")
async def model_info(name: str, engine: EngineDep) -> dict[str, Any]:
    model = engine.resolve(name, field="name")
    return _info(engine, model) | tei_info(engine, model)


def _hub_model(model: Capabilities) -> dict[str, Any]:
    tasks = served_tasks(model.task)
    return {"id": model.name, "modelId": model.name, "pipeline_tag": tasks[0], "tags": list(tasks),
            "private": False, "library_name": "transformer-serving"}  # fmt: skip


@router.get("/api/models", summary="The Hub's model list: each served model and its pipeline tag")
async def hub_models(engine: EngineDep) -> list[dict[str, Any]]:
    return [_hub_model(model) for model in engine.served().values()]


@router.get("/api/models/{name}", summary="The Hub's model info for one served model")
async def hub_model(name: str, engine: EngineDep) -> dict[str, Any]:
    return _hub_model(engine.resolve(name, field="name"))


@router.get("/models/{name}/health", summary="200 once this model is ready (InferenceClient.health_check)")
async def model_health(name: str, engine: EngineDep) -> JSONResponse:
    engine.resolve(name, field="name")
    ready = engine.ready and not engine.draining and engine.failure is None
    return JSONResponse({"status": "ok" if ready else "unavailable"}, status_code=200 if ready else 503)
