"""Sentence embeddings: a one-step encoder on the same scheduler as the other tasks. The graph pools the
hidden states as the checkpoint says (config.json "pooling"); the server normalises per request, keeps the
first `dimensions` where the model allows it, and runs each scheduled batch in runs of similar length
(service/engine/encoder_batch.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from tokenizers import Encoding

from contract.kinds import EMBEDDING
from contract.names import EMBEDDINGS, TOKEN_TYPE_IDS
from service.engine.capabilities import Capabilities
from service.engine.encoder_batch import Company, encoder_feeds, run_in_groups
from service.engine.errors import InvalidInput
from service.engine.handle import Handle
from service.engine.metrics import Metrics
from service.engine.scheduling import Scheduler
from service.engine.sequence import Emit, Sequence
from service.engine.task_service import TaskService, TruncationDirection, list_field, too_long
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession
from service.settings import Settings

EmbedInput = str | list[int]  # a text, or token ids as the model sees them (no special tokens added)


@dataclass(frozen=True)
class EmbeddingJob:
    """An embedding request: texts or token-id lists, `fields` naming each in errors."""

    task: ClassVar[str] = EMBEDDING.name
    inputs: list[EmbedInput]
    fields: list[str]
    normalize: bool | None = None  # None: the model's default (config.json "normalize")
    truncate: bool = False  # cut an input past the model's limit (else a 422 naming it)
    truncation_direction: TruncationDirection = "right"
    dimensions: int | None = None  # keep the first n dimensions (models trained for it only)
    model: str | None = None  # None: the task's default model


@dataclass(frozen=True)
class Embedding:
    vector: list[float]
    input_tokens: int


class EmbeddingSequence(Sequence):
    def __init__(self, ids: list[int], normalize: bool, dimensions: int | None) -> None:
        super().__init__(rows=1, prefill_tokens=len(ids))
        self.ids = ids
        self.normalize = normalize
        self.dimensions = dimensions


def finish(vector: np.ndarray, normalize: bool, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` values (all when None), scaled to unit length when `normalize`."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)  # sentence-transformers' eps
    return vector


class EmbeddingModel:
    """A one-step model for the scheduler: `prefill` pools a batch and emits every vector."""

    def __init__(self, artifact: Artifact, session: GraphSession) -> None:
        self.session = session
        self.pad = artifact.special_tokens["pad"]
        self.token_types = TOKEN_TYPE_IDS in session.input_names  # one segment: all zeros
        self.company = Company()

    def prefill(self, sequences: list[EmbeddingSequence]) -> tuple[list[Emit], None]:
        busy = self.company.busy([s.handle for s in sequences])  # as the classifier: leave the event loop a core
        vectors = self.run_batch([s.ids for s in sequences], busy)
        return [
            Emit(s, Embedding(finish(v, s.normalize, s.dimensions).tolist(), len(s.ids)), final=True)
            for s, v in zip(sequences, vectors, strict=True)
        ], None

    def run_batch(self, rows: list[list[int]], busy: bool = False) -> list[np.ndarray]:
        """The pooled vectors of `rows`, run in groups of similar length, in their order."""
        return run_in_groups([len(r) for r in rows], lambda group: self._run([rows[i] for i in group], busy))

    def _run(self, rows: list[list[int]], busy: bool) -> list[np.ndarray]:
        types = [[0] * len(r) for r in rows] if self.token_types else None
        out = self.session.run(encoder_feeds(rows, types, self.pad), [EMBEDDINGS], busy=busy)
        return list(np.asarray(out[EMBEDDINGS], dtype=np.float32))


class EmbeddingService(TaskService[EmbeddingSequence]):
    """Validates and tokenizes an embedding job; one sequence per input, on the model's scheduler."""

    task: ClassVar[str] = EMBEDDING.name

    def __init__(self, artifact: Artifact, session: GraphSession, settings: Settings, metrics: Metrics) -> None:
        super().__init__(artifact, settings)
        self.model = EmbeddingModel(artifact, session)
        self.scheduler = Scheduler.from_settings(self.name, self.model, settings, metrics)
        self.dimensions = artifact.dims["d_model"]

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), dimensions=self.dimensions)

    @property
    def max_tokens(self) -> int:
        return min(self.settings.max_input_tokens, self.artifact.max_positions)

    def _check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None or dimensions == self.dimensions:
            return
        if not self.artifact.dimensions_truncatable:
            raise InvalidInput(
                f"model {self.name!r} answers {self.dimensions} dimensions and was not trained for fewer", "dimensions"
            )
        if not 1 <= dimensions <= self.dimensions:
            raise InvalidInput(f"must be between 1 and {self.dimensions}", "dimensions")

    def token_rows(self, job: EmbeddingJob, encoded: list[Encoding | int]) -> list[list[int]]:
        """Each input's token ids: its Encoding's, or the ids given (checked, cut where asked)."""
        rows = []
        for field_name, item, encoding in zip(job.fields, job.inputs, encoded, strict=True):
            if isinstance(item, str):
                if not item.strip():
                    raise InvalidInput("the text is empty", field_name)
                if isinstance(encoding, int):
                    raise InvalidInput(too_long(encoding, self.max_tokens), field_name)
                rows.append(encoding.ids)
                continue
            if not item:
                raise InvalidInput("the token list is empty", field_name)
            if not all(0 <= t < self.artifact.vocab_size for t in item):
                raise InvalidInput(f"token ids must be in [0, {self.artifact.vocab_size})", field_name)
            if len(item) > self.max_tokens:
                if not job.truncate:
                    raise InvalidInput(too_long(len(item), self.max_tokens), field_name)
                item = item[: self.max_tokens] if job.truncation_direction == "right" else item[-self.max_tokens :]
            rows.append(list(item))
        return rows

    async def warmup(self) -> None:
        """A short text, and a batch of growing lengths, within the limit."""
        short = self.tokenizer.encode("warm up").ids[: self.max_tokens]
        size = min(self.settings.max_batch_size, self.settings.max_queue_size, 8)
        full = [self.tokenizer.encode("warm up the server " * (i + 1)).ids[: self.max_tokens] for i in range(size)]
        for batch in ([short], full):
            sequences = [EmbeddingSequence(ids, False, None) for ids in batch]
            await self.scheduler.submit(sequences, None, "input").results()

    async def submit(self, job: EmbeddingJob) -> Handle[Embedding, Embedding]:
        self._check_dimensions(job.dimensions)
        texts = [item for item in job.inputs if isinstance(item, str)]
        direction = job.truncation_direction if job.truncate else None
        encoded_texts = iter(await self.encode(texts, self.max_tokens, direction))
        encoded: list[Encoding | int] = [next(encoded_texts) if isinstance(i, str) else 0 for i in job.inputs]
        rows = self.token_rows(job, encoded)
        normalize = self.artifact.normalize if job.normalize is None else job.normalize
        sequences = [EmbeddingSequence(ids, normalize, job.dimensions) for ids in rows]
        handle: Handle[Embedding, Embedding] = self.scheduler.submit(sequences, self.deadline(), list_field(job.fields))
        handle.prompt_ids = rows
        return handle
