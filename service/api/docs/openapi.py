"""The OpenAPI document: what FastAPI builds from the code, plus what only the server knows. Every request
the document calls valid is one the server takes (schemathesis checks it in harness/reliability/contract.py),
and every example succeeds as shown (tests/clients/test_playground.py runs each one from /docs).

- The Inference API's dispatch routes (POST / and POST /models/{name}) read their body as plain JSON and
  validate it by the model's task: the document states those bodies.
- Known only after start-up, from the loaded models: the model names (enums, and the names in the
  examples), the classifier's label count (top_k's maximum), the limits of service/api/docs/openapi_limits.py,
  the task of POST /'s default model, one POST /models/<name> operation per served model (a body valid
  for one task is refused by another, which one templated operation cannot state) and one
  POST /models/<name>/pipeline/<task> per model and task it serves; the routes of a task no loaded model
  serves (TASK_ROUTES; /rerank without a one-label classifier, chat completions without a generator that
  has a chat template) are left out, so that /docs shows no example that answers 404.
- The description (ReDoc's and /docs' first paragraph): the tasks and the models served, from their cards."""

from __future__ import annotations

import copy
import re
from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from contract.kinds import CLASSIFICATION
from service.api.docs.openapi_limits import add_runtime_limits
from service.api.hf.embeddings import FeatureExtractionRequest, SentenceSimilarityRequest
from service.api.hf.routes import FORMS
from service.api.hf.tasks import served_tasks
from service.api.openai.chat import PATH as CHAT_PATH
from service.api.openai.chat import chat_models
from service.api.openai.models import summary
from service.api.tei.routes import reranker_or_none
from service.engine.engine import Engine
from service.engine.registry import records

REF = "#/components/schemas/{model}"
DISPATCH_PATHS = ("/", "/models/{name}", "/models/{name}/pipeline/{task}")
PIPELINE_PATH = "/models/{name}/pipeline/{task}"
# The Inference API tasks whose body differs from the one of the model's task (FORMS).
TASK_BODIES = {"feature-extraction": FeatureExtractionRequest, "sentence-similarity": SentenceSimilarityRequest}
DESCRIPTION_END = """Generation, translation and classification can return attention maps.

Errors have one shape: `{"error": {"type", "message", "field"}}`: 400 invalid JSON, 401 bad API key,
404 model not served here, 408 body not received in time, 413 body too large, 422 invalid input, 429 queue
full (with `Retry-After`), 503 draining, 504 timeout. The OpenAI-compatible routes (`/v1/completions`,
`/v1/chat/completions`, `/v1/embeddings`, `/v1/models`) answer OpenAI's `{"error": {"message", "type", "param",
"code"}}` instead, and TEI's (`/embed`, `/rerank`) TEI's `{"error", "error_type"}`.

Clients: OpenAI SDKs (`/v1`), Hugging Face TGI, TEI and Inference API clients (`/generate`,
`/generate_stream`, `/embed`, `/rerank`, `/info`, `POST /`, `POST /models/{name}`), vLLM-style tokenizer routes
(`/tokenize`, `/detokenize`, `/tokenizer_info`); a playground page at `/playground`."""
# Path parameters that name a served model.
MODEL_PARAMS = {
    ("/models/{name}/info", "name"),
    ("/models/{name}/health", "name"),
    ("/v1/models/{model_id}", "model_id"),
    ("/api/models/{name}", "name"),
}


def _model_fields() -> dict[str, str | None]:
    """The request bodies with a `model` field, and the task whose models it names (None: any model)."""
    bodies = {body: name for name, task in records().items() for body in task.request_bodies}
    return bodies | {"TokenizeRequest": None, "DetokenizeRequest": None}


def _member(prop: dict[str, Any], kind: str) -> dict[str, Any]:
    """The schema of `kind` within a property (`int` or `int | None`, `str` or `str | None`)."""
    return next((m for m in prop.get("anyOf", []) if m.get("type") == kind), prop)


def _body(ref: str | dict[str, Any]) -> dict[str, Any]:
    schema = {"$ref": REF.format(model=ref)} if isinstance(ref, str) else ref
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def add_dispatch_bodies(schema: dict[str, Any]) -> None:
    """POST / and POST /models/{name}: the request of any task (refined by `add_model_limits`)."""
    bodies = [*(f.body for f in FORMS.values()), *(f.root_body for f in FORMS.values())]
    _, definitions = models_json_schema([(m, "validation") for m in bodies], ref_template=REF)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in definitions.get("$defs", {}).items():
        components.setdefault(name, definition)
    any_task = {"anyOf": [{"$ref": REF.format(model=f.body.__name__)} for f in FORMS.values()]}
    for path in DISPATCH_PATHS:
        operation = schema["paths"].get(path, {}).get("post")
        if operation is not None:
            description = "`{inputs, parameters}`: the request of the model's task"
            operation["requestBody"] = {**_body(any_task), "description": description}


def add_model_limits(schema: dict[str, Any], app: FastAPI) -> None:
    engine: Engine | None = getattr(app.state, "engine", None)
    if engine is None:
        return
    components = schema.get("components", {}).get("schemas", {})
    served = list(engine.served())
    for component, task in _model_fields().items():
        if component in components:
            _name_models(components[component], engine.model_names(task) if task else served)
    if "ChatCompletionRequest" in components:  # the generators that have a chat template
        _name_models(components["ChatCompletionRequest"], chat_models(engine))
    if engine.default_model(CLASSIFICATION.name) is not None and "ClassifyRequest" in components:
        _top_k_by_model(components["ClassifyRequest"], engine)
    _example_token_ids(components, engine)
    add_runtime_limits(schema, engine)
    _drop_unserved(schema, engine)
    _dispatch_by_model(schema, engine)
    _pipeline_by_model(schema, engine)
    for path, name in MODEL_PARAMS:
        for operation in schema["paths"].get(path, {}).values():
            for param in operation.get("parameters", []):
                if param["name"] == name and served:
                    param["schema"]["enum"] = served
                    param["example"] = served[0]


def _top_k_by_model(component: dict[str, Any], engine: Engine) -> None:
    """top_k's maximum: the most labels of any classifier, and each classifier's own where it has fewer (the
    default's when the body names no model)."""
    labels = {name: len(model.labels) for name, model in engine.served().items() if model.task == CLASSIFICATION.name}
    most = max(labels.values())
    _member(component["properties"]["top_k"], "integer")["maximum"] = most
    default = engine.default_model(CLASSIFICATION.name)
    assert default is not None
    rules = [
        {"if": {"properties": {"model": {"const": name}}, "required": ["model"]},
         "then": {"properties": {"top_k": {"anyOf": [{"type": "integer", "maximum": n}, {"type": "null"}]}}}}
        for name, n in labels.items() if n < most
    ]  # fmt: skip
    if labels[default.name] < most:
        rules.append({"if": {"not": {"required": ["model"]}},
                      "then": {"properties": {"top_k": {"anyOf": [{"type": "integer", "maximum": labels[default.name]},
                                                                  {"type": "null"}]}}}})  # fmt: skip
    if rules:
        component.setdefault("allOf", []).extend(rules)


def _name_models(component: dict[str, Any], names: list[str]) -> None:
    """`model` takes the names of the served models of its task; the examples name the task's default."""
    model = component["properties"]["model"]
    if names:
        _member(model, "string")["enum"] = names
    for example in component.get("examples", []):
        if "model" in example:
            if names:
                example["model"] = names[0]
            else:  # no model of this task is served: the example names none
                del example["model"]


def _example_token_ids(components: dict[str, Any], engine: Engine) -> None:
    """Detokenize's example: the ids of tokenize's example text, in the vocabulary of the model it names."""
    detokenize, tokenize = components.get("DetokenizeRequest"), components.get("TokenizeRequest")
    by_name = engine.served()
    if detokenize is None or tokenize is None or not by_name:
        return
    text = tokenize["examples"][0]["prompt"]
    for example in detokenize.get("examples", []):
        model = by_name.get(example.get("model"), next(iter(by_name.values())))
        example["tokens"] = model.tokenizer.encode(text).ids


def _dispatch_by_model(schema: dict[str, Any], engine: Engine) -> None:
    """POST /: its default model's request, naming its task; POST /models/{name}: one operation per served model."""
    paths: dict[str, Any] = schema["paths"]
    by_name = engine.served()
    root = paths.get("/", {}).get("post")
    default = next(iter(by_name.values()), None)
    if root is not None and default is not None and default.task in FORMS:
        root["requestBody"] = _body(FORMS[default.task].root_body.__name__)  # naming its task
    templated = paths.get("/models/{name}", {}).get("post")
    if templated is None or not by_name:
        return
    operations = {}
    for name, model in by_name.items():
        if model.task not in FORMS:
            continue
        operation = copy.deepcopy(templated)
        operation["parameters"] = [p for p in operation.get("parameters", []) if p["name"] != "name"]
        operation["operationId"] = f"{templated['operationId']}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"
        operation["summary"] = f"{name}: the Inference API's {model.task} request"
        operation["requestBody"] = _body(FORMS[model.task].body.__name__)
        operations[f"/models/{name}"] = {"post": operation}
    others = {method: op for method, op in paths["/models/{name}"].items() if method != "post"}
    if others:
        operations["/models/{name}"] = others
    # In the templated operation's place, so that /docs lists them where it stood.
    schema["paths"] = {
        key: value for path, item in paths.items()
        for key, value in (operations.items() if path == "/models/{name}" else [(path, item)])
    }  # fmt: skip


def description(engine: Engine | None) -> str:
    """The document's description: one transformer server for the tasks of contract/kinds.py, and, once the
    models are loaded, each served model with what its card says it is for."""
    tasks = "\n".join(f"- {task.summary}" for task in records().values())
    text = f"One server, on ONNX Runtime, for transformers of each of these tasks:\n\n{tasks}\n\n"
    if engine is not None and engine.models:
        served = "\n".join(f"- `{n}` ({i.artifact.task}): {summary(i)}" for n, i in engine.models.items())
        text += f"Served here (`GET /v1/models`):\n\n{served}\n\n"
    return text + DESCRIPTION_END


def _drop_unserved(schema: dict[str, Any], engine: Engine) -> None:
    """The routes of a task no loaded model serves: every request to them would be a 404."""
    unserved = [path for name, task in records().items() if not engine.model_names(name) for path in task.routes]
    if reranker_or_none(engine) is None:
        unserved.append("/rerank")
    if not chat_models(engine):  # every chat request would be a 400: no loaded model has a chat template
        unserved.append(CHAT_PATH)
    for path in unserved:
        schema["paths"].pop(path, None)


def _pipeline_by_model(schema: dict[str, Any], engine: Engine) -> None:
    """POST /models/{name}/pipeline/{task}: one operation per served model and each task it answers."""
    paths: dict[str, Any] = schema["paths"]
    templated = paths.get(PIPELINE_PATH, {}).get("post")
    if templated is None:
        return
    operations = {}
    for name, model in engine.served().items():
        form = FORMS.get(model.task)
        if form is None:  # a task without an Inference API form
            continue
        for task in served_tasks(model.task):
            body = TASK_BODIES.get(task, form.body)
            if body.__name__ not in schema.get("components", {}).get("schemas", {}):
                continue
            operation = copy.deepcopy(templated)
            operation["parameters"] = [p for p in operation.get("parameters", []) if p["name"] not in ("name", "task")]
            operation["operationId"] = f"{templated['operationId']}_{re.sub(r'[^A-Za-z0-9_]', '_', f'{name}_{task}')}"
            operation["summary"] = f"{name}: the Inference API's {task} request"
            operation["requestBody"] = _body(body.__name__)
            operations[f"/models/{name}/pipeline/{task}"] = {"post": operation}
    schema["paths"] = {
        key: value for path, item in paths.items()
        for key, value in (operations.items() if path == PIPELINE_PATH else [(path, item)])
    }  # fmt: skip


class ServingApp(FastAPI):
    """FastAPI whose OpenAPI document also states the per-model request bodies of the dispatch routes and
    each loaded model's limits."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is not None:
            return self.openapi_schema
        schema = super().openapi()  # cached in self.openapi_schema: the additions below stay in it
        schema["info"]["description"] = description(getattr(self.state, "engine", None))
        add_dispatch_bodies(schema)
        add_model_limits(schema, self)
        return schema
