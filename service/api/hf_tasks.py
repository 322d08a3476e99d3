"""Which Inference API task a `POST /models/{name}` request asks for, so that a model asked for a task it does
not serve answers a 422 naming its own tasks instead of its own task's answer in the wrong shape.

huggingface_hub's InferenceClient, given a URL, posts every task to that URL as it is: no task in the path or
headers. The task shows only in the body: feature_extraction sends its options at the top level (and no
`parameters`); the other text tasks send `{"inputs", "parameters"}` with their own parameter names, and
`parameters: {}` at their defaults; sentence_similarity sends `inputs: {source_sentence, sentences}`. What the
body cannot tell: text_classification and token_classification at their defaults send the same bytes, so a
classifier answers both; `POST /models/{name}/pipeline/{task}` (the Inference API's own URL for a task)
names the task outright."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.kinds import TASKS
from service.api.errors import ApiError

# The Inference API tasks a model of each of our tasks answers (its pipeline tag first).
EXTRA_TASKS: dict[str, tuple[str, ...]] = {"embedding": ("sentence-similarity",)}
# Options feature_extraction sends at the top level of the body.
FEATURE_EXTRACTION_OPTIONS = ("normalize", "prompt_name", "truncate", "truncation_direction", "dimensions",
                              "encoding_format")  # fmt: skip
# `parameters` that only one task has.
PARAMETER_TASKS: dict[str, str] = {
    "aggregation_strategy": "token-classification",
    "ignore_labels": "token-classification",
    "stride": "token-classification",
    "function_to_apply": "text-classification",
    "candidate_labels": "zero-shot-classification",
    "multi_label": "zero-shot-classification",
    "hypothesis_template": "zero-shot-classification",
    "targets": "fill-mask",
    "src_lang": "translation",
    "tgt_lang": "translation",
    "generate_parameters": "translation",
    "max_new_tokens": "text-generation",
    "do_sample": "text-generation",
    "return_full_text": "text-generation",
    "decoder_input_details": "text-generation",
    "top_n_tokens": "text-generation",
}
# `inputs` objects that only one task has.
INPUT_TASKS: dict[str, str] = {"source_sentence": "sentence-similarity", "question": "question-answering"}


@dataclass(frozen=True)
class AskedTask:
    task: str  # a pipeline tag, or "another task" where the body fits several
    field: str  # what in the request tells it
    why: str = ""  # how it tells, where the field alone does not say


def served_tasks(task: str) -> tuple[str, ...]:
    """The Inference API tasks a model of our `task` (config.json "task") answers."""
    return (TASKS[task].pipeline_tag, *EXTRA_TASKS.get(task, ()))


def asked_task(payload: Any, served: tuple[str, ...]) -> AskedTask | None:
    """The task the body's shape asks for where it is none of `served`; None when it fits them (or when the
    body is malformed, which validation then names)."""
    if not isinstance(payload, Mapping):
        return None
    inputs, parameters = payload.get("inputs"), payload.get("parameters")
    found: list[AskedTask] = []
    if isinstance(inputs, Mapping):
        found += [AskedTask(task, f"inputs.{key}") for key, task in INPUT_TASKS.items() if key in inputs]
    found += [AskedTask("feature-extraction", key) for key in FEATURE_EXTRACTION_OPTIONS if key in payload]
    if isinstance(parameters, Mapping):
        found += [AskedTask(PARAMETER_TASKS[key], f"parameters.{key}") for key in parameters if key in PARAMETER_TASKS]
        if "feature-extraction" in served and not isinstance(inputs, Mapping):
            others = [key for key in parameters if key not in FEATURE_EXTRACTION_OPTIONS]
            if not parameters or others:  # feature_extraction never sends an empty or foreign `parameters`
                field = f"parameters.{others[0]}" if others else "parameters"
                why = "; feature-extraction takes its options at the top level, other tasks send `parameters`"
                found.append(AskedTask("another task", field, why))
    return next((asked for asked in found if asked.task not in served), None)


def wrong_task(name: str, served: tuple[str, ...], task: str, field: str) -> ApiError:
    return ApiError(
        422,
        "unsupported_task",
        f"model {name!r} serves {' and '.join(served)}, not {task}",
        field,
    )


def check_task(name: str, served: tuple[str, ...], payload: Any) -> None:
    """A 422 naming the model's tasks when the body asks for another one."""
    asked = asked_task(payload, served)
    if asked is not None:
        raise wrong_task(name, served, f"{asked.task} (asked by `{asked.field}`{asked.why})", asked.field)
