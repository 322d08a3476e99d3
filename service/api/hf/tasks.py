"""Which Inference API task a request on the dispatch routes asks for, so that a model asked for a task it
does not serve answers a 4xx naming its own tasks and what told, never its own task's answer in the wrong shape.

huggingface_hub's InferenceClient (2.x), given a URL, posts every task to that URL as it is: no task in the
path or the headers, where only text_to_image differs (`Accept: image/png`). The task shows in the body:
feature_extraction sends its options at the top level and no `parameters`; sentence_similarity,
question_answering and table_question_answering send an `inputs` object of their own keys; text_generation
with `stream` a top-level `stream`; every other text task `{"inputs", "parameters"}` with the parameters the
caller set, so `parameters` names a task only through keys few tasks take. At their defaults
text_generation, text_classification, token_classification, fill_mask, summarization, translation and
text_to_speech send the same bytes, `{"inputs": ..., "parameters": {}}`.

So a model's URL answers in its own task for a body that names none (as the Inference API does for a model's
URL) and refuses a body that names only other tasks; `POST /models/{name}/pipeline/{task}` names the task in
the URL; and `POST /`, which names no model, answers only a body whose every possible task its default model
serves, and names the URL of a model of the task otherwise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.api.errors import ApiError
from service.engine.registry import record

# Options feature_extraction sends at the top level of the body (older clients: in `parameters`).
FEATURE_EXTRACTION_OPTIONS = ("normalize", "prompt_name", "truncate", "truncation_direction", "dimensions",
                              "encoding_format")  # fmt: skip
_GENERATION = frozenset({
    "adapter_id", "best_of", "decoder_input_details", "details", "do_sample", "frequency_penalty", "grammar",
    "max_new_tokens", "repetition_penalty", "return_full_text", "seed", "stop", "temperature", "top_k",
    "top_n_tokens", "top_p", "truncate", "typical_p", "watermark",
})  # fmt: skip
# The `parameters` keys each task's InferenceClient method sends (TGI's for text-generation; classification's
# truncate and truncation_direction are this server's). text_to_speech is left out: its options are
# text_generation's, and no model here makes audio.
PARAMETERS: dict[str, frozenset[str]] = {
    "text-generation": _GENERATION,
    "text-classification": frozenset({"function_to_apply", "top_k", "truncate", "truncation_direction"}),
    "token-classification": frozenset({"aggregation_strategy", "ignore_labels", "stride"}),
    "fill-mask": frozenset({"targets", "top_k"}),
    "summarization": frozenset({"clean_up_tokenization_spaces", "generate_parameters", "truncation"}),
    "translation": frozenset({"src_lang", "tgt_lang", "clean_up_tokenization_spaces", "truncation",
                              "generate_parameters"}),
    "zero-shot-classification": frozenset({"candidate_labels", "multi_label", "hypothesis_template"}),
    "question-answering": frozenset({"align_to_words", "doc_stride", "handle_impossible_answer", "max_answer_len",
                                     "max_question_len", "max_seq_len", "top_k"}),
    "feature-extraction": frozenset(FEATURE_EXTRACTION_OPTIONS),
}  # fmt: skip
# `inputs` objects' keys, and top-level keys besides `inputs` and `parameters`, and the task each names.
INPUT_TASKS: dict[str, str] = {
    "source_sentence": "sentence-similarity", "sentences": "sentence-similarity",
    "question": "question-answering", "context": "question-answering",
    "query": "table-question-answering", "table": "table-question-answering",
    "text": "text-classification", "text_pair": "text-classification",
}  # fmt: skip
TOP_LEVEL_TASKS: dict[str, str] = {"stream": "text-generation", "table": "tabular-classification"}
TOP_LEVEL_TASKS |= dict.fromkeys(FEATURE_EXTRACTION_OPTIONS, "feature-extraction")
# The tasks whose InferenceClient method sends `{"inputs": ..., "parameters": {}}` at its defaults.
BARE_TASKS = ("text-generation", "text-classification", "token-classification", "fill-mask", "summarization",
              "translation", "text-to-speech")  # fmt: skip


@dataclass(frozen=True)
class Told:
    tasks: frozenset[str]  # the tasks whose clients send this
    field: str  # what in the request tells them
    why: str = ""  # how it tells, where the field alone does not say


def served_tasks(task: str) -> tuple[str, ...]:
    """The Inference API tasks a model of our `task` (config.json "task") answers."""
    return record(task).answers


# Each `parameters` key some task takes, and those tasks (a lookup: a body may hold many unknown keys).
_KEY_TASKS: dict[str, frozenset[str]] = {
    key: frozenset(task for task, keys in PARAMETERS.items() if key in keys)
    for key in sorted(set().union(*PARAMETERS.values()))
}


def signals(payload: Mapping[str, Any]) -> list[Told]:
    """What in the body names its task (keys no task sends are ignored, as TGI ignores them); [] for a bare body."""
    inputs, parameters = payload.get("inputs"), payload.get("parameters")
    found: list[Told] = []
    if isinstance(inputs, Mapping):
        found += [Told(frozenset({task}), f"inputs.{key}") for key, task in INPUT_TASKS.items() if key in inputs]
    found += [Told(frozenset({task}), key) for key, task in TOP_LEVEL_TASKS.items() if key in payload]
    if isinstance(parameters, Mapping):
        found += [Told(_KEY_TASKS[key], f"parameters.{key}") for key in parameters if key in _KEY_TASKS]
    return found


def bare(payload: Mapping[str, Any]) -> Told:
    """A body that names no task: with `parameters`, any of BARE_TASKS; without (or null), feature_extraction's
    or one written by hand."""
    if payload.get("parameters") is not None:
        return Told(frozenset(BARE_TASKS), "parameters")
    return Told(frozenset({"feature-extraction"}), "inputs")


def _phrase(tasks: Sequence[str]) -> str:
    return tasks[0] if len(tasks) == 1 else f"{', '.join(tasks[:-1])} or {tasks[-1]}"


def _ordered(tasks: frozenset[str]) -> list[str]:
    order = [*PARAMETERS, *BARE_TASKS, *INPUT_TASKS.values(), *TOP_LEVEL_TASKS.values()]
    return sorted(tasks, key=lambda task: order.index(task) if task in order else len(order))


def _where(tasks: frozenset[str], models: Mapping[str, Sequence[str]]) -> str:
    """Where models of `tasks` are served (`models`: task -> the served models' names, the default first)."""
    urls = [f"{task} at POST /models/{models[task][0]}" for task in _ordered(tasks) if models.get(task)]
    return ", ".join(urls) or "no model served here answers it"


def wrong_task(name: str, served: Sequence[str], task: str, field: str, where: str = "") -> ApiError:
    return ApiError(422, "unsupported_task", f"model {name!r} serves {' and '.join(served)}, not {task}{where}", field)


def _refuse(name: str, served: Sequence[str], told: Told, models: Mapping[str, Sequence[str]]) -> ApiError:
    task = f"{_phrase(_ordered(told.tasks))} (asked by `{told.field}`{told.why})"
    return wrong_task(name, served, task, told.field, f": {_where(told.tasks, models)}" if models else "")


def check_task(
    name: str, served: Sequence[str], payload: Any, models: Mapping[str, Sequence[str]] | None = None
) -> None:
    """A model's URL (or a URL naming the task: `served` is that task): a 422 naming the model's tasks when
    something in the body asks only for others; a body that names no task gets the model's own."""
    if not isinstance(payload, Mapping):
        return  # validation names what is wrong with it
    told = signals(payload)
    foreign = _foreign_parameters(payload) if "feature-extraction" in served else None
    if foreign is not None:
        told.append(foreign)
    elif not told and payload.get("parameters") is not None and not isinstance(payload.get("inputs"), Mapping):
        told.append(bare(payload))
    for asked in told:
        if not asked.tasks & set(served) or asked is foreign:
            raise _refuse(name, served, asked, models or {})


def _foreign_parameters(payload: Mapping[str, Any]) -> Told | None:
    """feature_extraction sends its options at the top level (older clients: in `parameters`): an empty
    `parameters`, or one with a key no task takes, is another task's body (other tasks' keys are signals)."""
    parameters = payload.get("parameters")
    if not isinstance(parameters, Mapping) or isinstance(payload.get("inputs"), Mapping):
        return None
    foreign = next((key for key in parameters if key not in _KEY_TASKS), None)
    if parameters and foreign is None:
        return None
    field = "parameters" if foreign is None else f"parameters.{foreign}"
    return Told(frozenset(BARE_TASKS), field, "; feature_extraction sends its options at the top level")


# A field only the task's clients send, for the root's 422 to say how to name the task.
NAMING: dict[str, str] = {
    "text-generation": "parameters.max_new_tokens", "text-classification": "parameters.function_to_apply",
    "translation": "parameters.src_lang and tgt_lang", "feature-extraction": "normalize",
    "sentence-similarity": "inputs.source_sentence",
}  # fmt: skip


def check_root(name: str, served: Sequence[str], payload: Any, models: Mapping[str, Sequence[str]]) -> None:
    """`POST /`, the default model `name`: a 422 unless every task a client could mean by this body is one
    the model serves (a bare body could be any of several tasks: it is refused, naming them)."""
    check_task(name, served, payload, models)
    if not isinstance(payload, Mapping):
        return
    told = signals(payload) or [bare(payload)]
    possible = frozenset.intersection(*(asked.tasks for asked in told))
    if possible <= set(served):
        return
    field = next(asked.field for asked in told if not asked.tasks <= set(served))
    alike = f"is sent alike for {_phrase(_ordered(possible))}"
    sent = {
        "inputs": "a body without `parameters` is what feature_extraction sends",
        "parameters": f"a body whose `parameters` name no task (empty: a task's defaults) {alike}",
    }.get(field, f"a body with `{field}` {alike}")
    naming = "; ".join(f"{task}: {NAMING[task]}" for task in served if task in NAMING)
    message = (
        f"POST / answers model {name!r} ({' and '.join(served)}) for a body that names its task, and {sent}: "
        f"name the task ({naming}), or post to a model's URL: {_where(possible | set(served), models)}"
    )
    raise ApiError(422, "ambiguous_task", message, field)


# What an `Accept` header may ask for on the dispatch routes: they answer JSON, or Server-Sent Events.
_ANSWERED = {"*/*", "*", "application/*", "application/json", "text/*", "text/event-stream"}
_MEDIA_TASKS = {"image": "text-to-image", "audio": "text-to-speech", "video": "text-to-video"}


def check_accept(accept: str | None) -> None:
    """A 406 where the client accepts none of what these routes answer (InferenceClient's text_to_image sends
    `Accept: image/png`)."""
    if not accept or not accept.strip():
        return
    media = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    if any(m in _ANSWERED or m.endswith("+json") for m in media):
        return
    asked = sorted({_MEDIA_TASKS[m.split("/")[0]] for m in media if m.split("/")[0] in _MEDIA_TASKS})
    what = f" ({_phrase(asked)}, which no model here serves)" if asked else ""
    message = f"these routes answer JSON or Server-Sent Events; `Accept: {accept}` asks for neither{what}"
    raise ApiError(406, "not_acceptable", message, "Accept")


def naming_schema(served: Sequence[str]) -> dict[str, Any]:
    """The JSON Schema of a body that names only tasks among `served` (what check_root answers), for `POST /`
    in the OpenAPI document."""

    def one_of_keys(keys: list[str]) -> dict[str, Any]:
        return {"type": "object", "anyOf": [{"required": [key]} for key in keys]}

    own = sorted(key for key, tasks in _KEY_TASKS.items() if tasks <= set(served))
    ways: list[dict[str, Any]] = [{"required": [key]} for key, task in TOP_LEVEL_TASKS.items() if task in served]
    if own:
        ways.append({"required": ["parameters"], "properties": {"parameters": one_of_keys(own)}})
    inputs = [key for key, task in INPUT_TASKS.items() if task in served]
    if inputs:
        ways.append({"required": ["inputs"], "properties": {"inputs": one_of_keys(inputs)}})
    if "feature-extraction" in served:  # no `parameters`: feature_extraction's body
        ways.append({"properties": {"parameters": {"type": "null"}}})
    return {"anyOf": ways}
