"""The engine: loads the models named in the settings, runs their schedulers, warms up, and takes every
request through one interface: `await submit(job) -> handle` (service/engine/handle.py).

Built in the app's lifespan (never at import time) and reached by the routes through `app.state.engine`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from contract.kinds import KINDS
from contract.weights_package import WeightsPackageError
from service.engine.classification import ClassificationJob, ClassificationService
from service.engine.embedding import EmbeddingJob, EmbeddingService
from service.engine.errors import ModelNotLoaded, Unavailable
from service.engine.generation_service import GenerationHandle, GenerationJob, GenerationService
from service.engine.handle import Handle
from service.engine.metrics import Metrics
from service.engine.task_service import ThreadWork, TokenizerWork
from service.engine.translation_service import TranslationJob, TranslationService
from service.runtime.artifact import Artifact, ArtifactError, load_artifact
from service.runtime.checks import check_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions, artifact_sessions
from service.settings import Settings

log = logging.getLogger(__name__)

S = TypeVar("S")

Service = TranslationService | GenerationService | ClassificationService | EmbeddingService
Job = TranslationJob | GenerationJob | ClassificationJob | EmbeddingJob


@dataclass
class ModelInfo:
    name: str
    artifact: Artifact
    sessions: dict[str, GraphSession]
    loaded_at: float


class Engine:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.models: dict[str, ModelInfo] = {}
        # Every loaded model by name; the four below are each task's default (its first in SERVE_MODELS),
        # which serves requests that name no model.
        self.services: dict[str, Service] = {}
        self.translator: TranslationService | None = None
        self.generator: GenerationService | None = None
        self.classifier: ClassificationService | None = None
        self.embedder: EmbeddingService | None = None
        self.ready = False
        self.draining = False  # set on SIGTERM: /ready turns 503, the API refuses new inference requests
        self.failure: str | None = None
        self.tokenizer_work: TokenizerWork = ThreadWork()

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
        )
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
            args = (self.settings, self.metrics)
            service: Service
            if artifact.task == "translation":
                service = TranslationService(artifact, sessions["encoder"], sessions["decoder"], *args)
                self.translator = service if self.translator is None else self.translator
            elif artifact.task == "generation":
                service = GenerationService(artifact, sessions["decoder"], *args)
                self.generator = service if self.generator is None else self.generator
            elif artifact.task == "embedding":
                service = EmbeddingService(artifact, sessions["encoder"], *args)
                self.embedder = service if self.embedder is None else self.embedder
            else:
                service = ClassificationService(artifact, sessions["encoder"], *args)
                self.classifier = service if self.classifier is None else self.classifier
            service.tokenizer_work = self.tokenizer_work
            self.services[name] = service
            check_artifact(artifact, sessions, service.tokenizer, self.settings.max_input_tokens)

    def start(self) -> None:
        """Start every model's worker thread (ORT calls block, and must stay off the event loop)."""
        for service in self.services.values():
            service.scheduler.start()

    async def stop(self, reason: str = "the server is shutting down") -> None:
        """Fail everything queued or running with 503 `unavailable` (idempotent): streams end with an
        error event, waiting requests answer 503."""
        error = Unavailable(reason)
        for service in self.services.values():
            await service.scheduler.stop(error)

    async def warmup(self) -> None:
        """Run a few representative batches through every model (first-run allocations, thread pools)."""
        started = time.perf_counter()
        await asyncio.gather(*(service.warmup() for service in self.services.values()))
        log.info("warm-up finished in %.2fs", time.perf_counter() - started)

    async def submit(self, job: Job) -> Handle[Any, Any]:
        """Validate and queue a job on its model (`job.model`, or the task's default); raises an
        EngineError (422, 404, 429) with nothing queued. Long texts are tokenized off the event loop."""
        if isinstance(job, GenerationJob):
            return await self.submit_generation(job)
        if isinstance(job, TranslationJob):
            return await self.require_translator(job.model).submit(job)
        if isinstance(job, EmbeddingJob):
            return await self.require_embedder(job.model).submit(job)
        return await self.require_classifier(job.model).submit(job)

    async def submit_generation(self, job: GenerationJob) -> GenerationHandle:
        return await self.require_generator(job.model).submit(job)

    def model_names(self, task: str) -> list[str]:
        """The loaded models of ``task``, the default (first) one first."""
        return [name for name, info in self.models.items() if info.artifact.task == task]

    def require_translator(self, model: str | None = None) -> TranslationService:
        return self._require(self.translator, TranslationService, "translation", model)

    def require_generator(self, model: str | None = None) -> GenerationService:
        return self._require(self.generator, GenerationService, "generation", model)

    def require_classifier(self, model: str | None = None) -> ClassificationService:
        return self._require(self.classifier, ClassificationService, "classification", model)

    def require_embedder(self, model: str | None = None) -> EmbeddingService:
        return self._require(self.embedder, EmbeddingService, "embedding", model)

    def _require(self, default: S | None, kind: type[S], task: str, model: str | None) -> S:
        """The named model (it must serve ``task``), or the task's default when ``model`` is None."""
        if model is None:
            if default is None:
                raise ModelNotLoaded(f"no {task} model is loaded (SERVE_MODELS={','.join(self.settings.models)})")
            return default
        service = self.services.get(model)
        if not isinstance(service, kind):
            same_task = [name for name, s in self.services.items() if isinstance(s, kind)]
            article = "an" if task[0] in "aeiou" else "a"
            message = f"model {model!r} is not {article} {task} model served here; served: {same_task}"
            raise ModelNotLoaded(message, "model")
        return service
