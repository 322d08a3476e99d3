"""The task registry: one record per served task, each in its folder (service/engine/tasks/<task>/task.py),
listed here once. The engine builds each model's service from its task's record; the protocols and the
OpenAPI document read the records (and each model's Capabilities) instead of branching on service types.

Adding a task: its kind in contract/kinds.py, its folder under service/engine/tasks/ (service, job, record),
its route module, and its name in REGISTERED."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from contract.kinds import Task
from service.engine.metrics import Metrics
from service.engine.task_service import TaskService
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession
from service.settings import Settings

# Each task's folder under service/engine/tasks/, in default order: a request that names no model and no
# task (TGI, the Inference API's POST /, the tokenizer routes) goes to the first task's default model.
REGISTERED = ("generation", "translation", "classification", "embedding")

Service = TaskService[Any]
S = TypeVar("S", bound=Service)
ServiceFactory = Callable[[Artifact, dict[str, GraphSession], Settings, Metrics], Service]


@dataclass(frozen=True)
class TaskRecord:
    task: Task  # the contract's record: config.json "task", graph roles, special tokens
    build: ServiceFactory  # the service of a model of this task, from its artifact and graph sessions
    route_module: str  # the module whose `router` serves the task's own routes (imported by the app)
    routes: tuple[str, ...]  # the paths only a model of this task answers (dropped from /docs without one)
    summary: str  # what the server does with such a model, for the OpenAPI description
    request_bodies: tuple[str, ...] = ()  # request bodies (OpenAPI components) whose `model` names one
    inference_tasks: tuple[str, ...] = ()  # the Inference API tasks beside its pipeline tag that it answers

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def answers(self) -> tuple[str, ...]:
        """The Inference API tasks a model of this task answers, its pipeline tag first."""
        return (self.task.pipeline_tag, *self.inference_tasks)


@cache
def records() -> dict[str, TaskRecord]:
    """Every registered task's record by name, in REGISTERED order (imported on first use)."""
    found: dict[str, TaskRecord] = {}
    for name in REGISTERED:
        record = importlib.import_module(f"service.engine.tasks.{name}.task").TASK
        assert isinstance(record, TaskRecord) and record.name == name, f"service/engine/tasks/{name}/task.py"
        found[name] = record
    return found


def record(task: str) -> TaskRecord:
    return records()[task]


def as_service(service: Service | None, kind: type[S]) -> S | None:
    """`service` as the service class `kind` (None where it is another): the engine's typed defaults."""
    return service if isinstance(service, kind) else None
