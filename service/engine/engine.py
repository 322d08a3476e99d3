"""The engine: loads the models named in the settings, runs their schedulers, warms up, and takes every
request through one interface: `await submit(job) -> handle` (service/engine/handle.py).

Built in the app's lifespan (never at import time) and reached by the routes through `app.state.engine`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Generic, Protocol, overload

from contract.kinds import KINDS
from contract.weights_package import WeightsPackageError
from service.engine.capabilities import Capabilities
from service.engine.errors import ModelNotLoaded, Unavailable
from service.engine.handle import Handle
from service.engine.heap_trim import TRIM_AVAILABLE, IdleTrim, hold_freed_memory
from service.engine.metrics import Metrics
from service.engine.registry import S, Service, as_service, record, records
from service.engine.scheduling import Scheduler
from service.engine.task_service import ThreadWork, TokenizerWork
from service.engine.tasks.classification.service import ClassificationService
from service.engine.tasks.embedding.service import EmbeddingService
from service.engine.tasks.generation.service import GenerationHandle, GenerationJob, GenerationService
from service.engine.tasks.translation.service import TranslationService
from service.runtime.artifact import Artifact, ArtifactError, load_artifact
from service.runtime.checks import check_artifact
from service.runtime.cpu_limit import cpu_limit
from service.runtime.sessions import GraphSession, RuntimeOptions, artifact_sessions
from service.settings import Settings

log = logging.getLogger(__name__)


class Job(Protocol):
    """What every task's job states: its task (config.json's) and the model it names (None: the default)."""

    @property
    def task(self) -> str: ...

    @property
    def model(self) -> str | None: ...


class EngineProcess(Protocol):
    """A front end's link to the engine process where its models run (SERVE_API_PROCESSES > 1:
    service/multiprocess/front.py)."""

    failure: str | None

    async def connect(self) -> None: ...

    async def wait_ready(self) -> None:
        """Until the engine process is warm; raises with its failure if it cannot be."""
        ...


@dataclass
class ModelInfo:
    name: str
    artifact: Artifact
    sessions: dict[str, GraphSession]
    loaded_at: float


class DefaultService(Generic[S]):
    """An Engine attribute that reads as the default model of one service type (None where none is loaded)."""

    def __init__(self, kind: type[S]) -> None:
        self.kind: type[S] = kind

    def __get__(self, engine: Engine | None, owner: type[Engine]) -> S | None:
        return None if engine is None else engine.default(self.kind)  # None: read on the class itself


class Engine:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.models: dict[str, ModelInfo] = {}
        # Every loaded model by name, in SERVE_MODELS order: a task's first is its default, which serves
        # requests that name no model.
        self.services: dict[str, Service] = {}
        self.capabilities: dict[str, Capabilities] = {}  # what each model can do, for the protocols
        self.ready = False
        self.draining = False  # set on SIGTERM: /ready turns 503, the API refuses new inference requests
        self.failure: str | None = None
        self.tokenizer_work: TokenizerWork = ThreadWork()
        self.remote: EngineProcess | None = None  # set in a front-end process: the models run elsewhere
        # The memory a burst used goes back to the OS once every model is idle (service/engine/heap_trim.py).
        trims = settings.memory_trim_idle_s > 0 and TRIM_AVAILABLE
        self.idle_trim = IdleTrim(settings.memory_trim_idle_s) if trims else None

    def share_tokenizer_work(self, work: TokenizerWork) -> None:
        """Every model tokenizes long texts on `work` (the API's bounded worker slots, /tokenize's too)."""
        self.tokenizer_work = work
        for service in self.services.values():
            service.tokenizer_work = work

    def load(self) -> None:
        """Create the ORT sessions and services (blocking; call it off the event loop)."""
        options = RuntimeOptions(
            device=self.settings.device,
            intra_op_threads=self.settings.intra_op_threads,
            inter_op_threads=self.settings.inter_op_threads,
            quantization=self.settings.quantization,
            io_binding=self.settings.io_binding,
            busy_intra_op_threads=self.settings.busy_intra_op_threads,
            fuse_attention=self.settings.fuse_attention,
            spin_between_runs=self.settings.spin_between_runs,
            cpu_mem_arena=self.idle_trim is None,  # the arena never gives memory back: not where the trim does
        )
        threads, spinning, limit = options.threads(), options.spins_between_runs(), cpu_limit()
        if limit is not None:
            log.info(
                "CPU limit %.2f CPUs: %d intra-op threads, %s between runs",
                limit,
                threads,
                "spinning" if spinning else "parked",
            )
        self.metrics.runtime.labels(str(threads), str(spinning).lower(), f"{limit or 0:g}").set(1)
        for name in self.settings.models:
            artifact = load_artifact(self.settings.artifacts_dir / name)
            if artifact.name != name:  # the folder name is the served name, in SERVE_MODELS and in requests
                raise ArtifactError(
                    f"{artifact.folder}: config.json names the model {artifact.name!r} but its folder is {name!r}; "
                    "rename one of them"
                )
            kind = KINDS.get(name)  # a folder named after a model kind holds one; others take their artifact's task
            if kind is not None and artifact.task != kind.task.name:
                raise ArtifactError(
                    f"{artifact.folder}: a {name} must have task {kind.task.name!r}, not {artifact.task!r}"
                )
            try:
                initializers = artifact.weights_package.load() if artifact.weights_package else None
            except WeightsPackageError as exc:
                raise ArtifactError(f"{artifact.folder}: {exc}") from None
            sessions = artifact_sessions(name, artifact.graphs, options, initializers, artifact.dims)
            self.models[name] = ModelInfo(name, artifact, sessions, time.time())
            service = record(artifact.task).build(artifact, sessions, self.settings, self.metrics)
            service.tokenizer_work = self.tokenizer_work
            self.services[name] = service
            self.capabilities[name] = service.capabilities()
            check_artifact(artifact, sessions, service.tokenizer, self.settings.max_input_tokens)

    async def start(self) -> None:
        """Start every model's worker thread (ORT calls block, and must stay off the event loop); in a
        front-end process, connect to the engine process instead."""
        if self.remote is not None:
            await self.remote.connect()
        elif self.idle_trim is not None:  # the engine's process (front ends fork before this)
            hold_freed_memory()
        for service in self.services.values():
            if isinstance(service.scheduler, Scheduler):  # not a front end's RemoteScheduler
                service.scheduler.idle_trim = self.idle_trim
            service.scheduler.start()

    async def stop(self, reason: str = "the server is shutting down") -> None:
        """Fail everything queued or running with 503 `unavailable` (idempotent): streams end with an
        error event, waiting requests answer 503."""
        error = Unavailable(reason)
        for service in self.services.values():
            await service.scheduler.stop(error)

    async def warmup(self) -> None:
        """Run a few representative batches through every model (first-run allocations, thread pools); in
        a front-end process, wait until the engine process has."""
        if self.remote is not None:
            await self.remote.wait_ready()
            return
        started = time.perf_counter()
        await asyncio.gather(*(service.warmup() for service in self.services.values()))
        log.info("warm-up finished in %.2fs", time.perf_counter() - started)

    @overload
    async def submit(self, job: GenerationJob) -> GenerationHandle: ...

    @overload
    async def submit(self, job: Job) -> Handle[Any, Any]: ...

    async def submit(self, job: Job) -> Handle[Any, Any]:
        """Validate and queue a job on its model (`job.model`, or the task's default); raises an
        EngineError (422, 404, 429) with nothing queued. Long texts are tokenized off the event loop.
        Every protocol's requests come through here."""
        service: Any = self._service(job.model, job.task)  # the service of job.task: it takes this job
        handle: Handle[Any, Any] = await service.submit(job)
        return handle

    def model_names(self, task: str) -> list[str]:
        """The loaded models of ``task``, the default (first) one first."""
        return [name for name, service in self.services.items() if service.artifact.task == task]

    def served(self) -> dict[str, Capabilities]:
        """What every loaded model can do, by name, the tasks' defaults first (in the registry's order)."""
        defaults = [self._default(task) for task in records()]
        return {s.name: self.capabilities[s.name] for s in defaults if s is not None} | self.capabilities

    def resolve(self, name: str | None, task: str | None = None, field: str = "model") -> Capabilities:
        """The one place a request's model is found: ``name`` (of ``task``, when a route serves one task),
        or the default when ``name`` is None. Raises ModelNotLoaded (404) naming ``field``."""
        return self.capabilities[self._service(name, task, field).name]

    def _service(self, name: str | None, task: str | None = None, field: str = "model") -> Service:
        if name is None:
            tasks = [task] if task else list(records())
            default = next((d for d in map(self._default, tasks) if d is not None), None)
            if default is None:
                what = f"no {task} model is loaded" if task else "no model is loaded"
                raise ModelNotLoaded(f"{what} (SERVE_MODELS={','.join(self.settings.models)})")
            return default
        service = self.services.get(name)
        if service is None or (task is not None and service.artifact.task != task):
            if task is None:
                served = ", ".join(repr(n) for n in self.served())
                raise ModelNotLoaded(f"model {name!r} is not served here; served: {served}", field)
            article = "an" if task[0] in "aeiou" else "a"
            message = f"model {name!r} is not {article} {task} model served here; served: {self.model_names(task)}"
            raise ModelNotLoaded(message, field)
        return service

    def _default(self, task: str) -> Service | None:
        return next((s for s in self.services.values() if s.artifact.task == task), None)

    def default_model(self, task: str) -> Capabilities | None:
        """What the default model of ``task`` can do; None where none is loaded."""
        default = self._default(task)
        return None if default is None else self.capabilities[default.name]

    def default(self, kind: type[S]) -> S | None:
        """The default model of ``kind``'s task, as that service; None where none is loaded."""
        return as_service(self._default(kind.task), kind)

    # The tasks' default models, typed (for in-process drivers: tests, benchmarks, the reliability suite):
    # engine.translator is engine.default(TranslationService).
    translator = DefaultService(TranslationService)
    generator = DefaultService(GenerationService)
    classifier = DefaultService(ClassificationService)
    embedder = DefaultService(EmbeddingService)
