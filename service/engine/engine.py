"""The engine: loads the models named in the settings, runs their batchers and schedulers, warms up.

Built in the app's lifespan (never at import time) and reached by the routes through `app.state.engine`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from service.engine.classification import ClassificationService
from service.engine.errors import ModelNotLoaded, Unavailable
from service.engine.generation import GenerationService
from service.engine.metrics import Metrics
from service.engine.scheduler import collect
from service.engine.translation import TranslationService
from service.runtime.artifact import Artifact, ArtifactError, load_artifact
from service.runtime.checks import check_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions
from service.settings import Settings

log = logging.getLogger(__name__)

S = TypeVar("S")

TASKS = {"translator": "translation", "generator": "generation", "classifier": "classification"}


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
        self.translator: TranslationService | None = None
        self.generator: GenerationService | None = None
        self.classifier: ClassificationService | None = None
        # One worker thread per model: ORT calls block, and must stay off the event loop.
        self._executors: dict[str, ThreadPoolExecutor] = {}
        self.ready = False
        self.draining = False  # set on SIGTERM: /ready turns 503, the API refuses new inference requests
        self.failure: str | None = None

    def load(self) -> None:
        """Create the ORT sessions and services (blocking; call it off the event loop)."""
        options = RuntimeOptions(
            device=self.settings.device,
            intra_op_threads=self.settings.intra_op_threads,
            inter_op_threads=self.settings.inter_op_threads,
            quantization=self.settings.quantization,
            io_binding=self.settings.io_binding,
        )
        for name in self.settings.models:
            artifact = load_artifact(self.settings.artifacts_dir / name)
            if artifact.task != TASKS[name]:
                raise ArtifactError(
                    f"{artifact.folder}: a {name} must have task {TASKS[name]!r}, not {artifact.task!r}"
                )
            sessions = {role: GraphSession(name, spec, options) for role, spec in artifact.graphs.items()}
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-{name}")
            self._executors[name] = executor
            self.models[name] = ModelInfo(name, artifact, sessions, time.time())
            args = (self.settings, executor, self.metrics)
            service: TranslationService | GenerationService | ClassificationService
            if artifact.task == "translation":
                service = self.translator = TranslationService(artifact, sessions["encoder"], sessions["decoder"], *args)
            elif artifact.task == "generation":
                service = self.generator = GenerationService(artifact, sessions["decoder"], *args)
            else:
                service = self.classifier = ClassificationService(artifact, sessions["encoder"], *args)
            check_artifact(artifact, sessions, service.tokenizer, self.settings.max_input_tokens)

    def start(self) -> None:
        for service in (self.translator, self.generator):
            if service is not None:
                service.scheduler.start()
        if self.classifier is not None:
            self.classifier.batcher.start()

    async def stop(self, reason: str = "the server is shutting down") -> None:
        """Fail everything queued or running with 503 `unavailable` (idempotent)."""
        error = Unavailable(reason)
        for service in (self.translator, self.generator):
            if service is not None:
                await service.scheduler.stop(error)
        if self.classifier is not None:
            await self.classifier.batcher.stop(error)
        for executor in self._executors.values():
            executor.shutdown(wait=False, cancel_futures=True)

    async def warmup(self) -> None:
        """Run a few representative batches through every model (first-run allocations, thread pools)."""
        started = time.perf_counter()
        services = [s for s in (self.translator, self.generator, self.classifier) if s is not None]
        await collect([service.warmup() for service in services])
        log.info("warm-up finished in %.2fs", time.perf_counter() - started)

    def require_translator(self) -> TranslationService:
        return self._require(self.translator, "translation")

    def require_generator(self) -> GenerationService:
        return self._require(self.generator, "generation")

    def require_classifier(self) -> ClassificationService:
        return self._require(self.classifier, "classification")

    def _require(self, service: S | None, task: str) -> S:
        if service is None:
            raise ModelNotLoaded(f"no {task} model is loaded (SERVE_MODELS={','.join(self.settings.models)})")
        return service
