"""Sequence classification (single texts and sentence pairs): a one-step model on the same scheduler as
generation and translation (one queue, one timeout and cancellation mechanism, one set of metrics)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from contract.kinds import CLASSIFICATION
from contract.names import ATTENTIONS, LOGITS, TOKEN_TYPE_IDS, layer_names
from service.engine.attention import check_budget, check_length, to_json
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

ClassifyInput = str | tuple[str, str]


@dataclass(frozen=True)
class ClassificationJob:
    """A classification request: texts or sentence pairs, `fields` naming each in errors."""

    task: ClassVar[str] = CLASSIFICATION.name
    inputs: list[ClassifyInput]
    fields: list[str]
    top_k: int | None = None
    return_attention: bool = False
    truncate: bool = False  # cut a text past the model's limit (else a 422 naming it)
    truncation_direction: TruncationDirection = "right"
    model: str | None = None  # None: the task's default model


@dataclass(frozen=True)
class ClassifyItem:
    ids: list[int]
    type_ids: list[int]
    attention: bool


@dataclass(frozen=True)
class Classification:
    label: str
    score: float
    scores: dict[str, float]  # every label, in label order
    logits: list[float]  # the raw scores, in label order
    top_k: list[tuple[str, float]] | None
    input_tokens: int
    attention: dict[str, Any] | None = None


def label_probabilities(logits: np.ndarray) -> np.ndarray:
    """Softmax over the labels; a one-label model (a cross-encoder's relevance score) gets the sigmoid, as
    sentence-transformers' CrossEncoder and TEI's /rerank answer."""
    if logits.shape[-1] == 1:
        return np.asarray(1.0 / (1.0 + np.exp(-logits)))
    probs = np.exp(logits - logits.max())
    return np.asarray(probs / probs.sum())


class ClassificationSequence(Sequence):
    def __init__(self, item: ClassifyItem, top_k: int | None) -> None:
        super().__init__(rows=1, prefill_tokens=len(item.ids))
        self.item = item
        self.top_k = top_k


class ClassificationModel:
    """A one-step model for the scheduler: `prefill` runs a right-padded batch and emits every result."""

    def __init__(self, artifact: Artifact, session: GraphSession, tokenizer: Tokenizer) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.labels = list(artifact.labels)
        self.pad = artifact.special_tokens["pad"]
        names = layer_names(ATTENTIONS, artifact.dims["n_layers"])
        self.attention_names = names if all(session.has_output(n) for n in names) else []
        self.token_types = TOKEN_TYPE_IDS in session.input_names  # RoBERTa-like families have none
        self.company = Company()

    def prefill(self, sequences: list[ClassificationSequence]) -> tuple[list[Emit], None]:
        # Other requests in flight keep the event loop busy: leave it a core.
        busy = self.company.busy([s.handle for s in sequences])
        outputs = self.run_batch([s.item for s in sequences], busy)
        return [
            Emit(s, self.result(s.item, logits, maps, s.top_k), final=True)
            for s, (logits, maps) in zip(sequences, outputs, strict=True)
        ], None

    def run_batch(
        self, items: list[ClassifyItem], busy: bool = False
    ) -> list[tuple[np.ndarray, list[np.ndarray] | None]]:
        """Label logits (and attention maps, where asked) for each item, in runs of similar length."""
        asked = [item.attention for item in items]
        if any(asked) and not all(asked):
            # A run returns maps for every row: the rows that asked get a run of their own, or one small
            # request would make a batch of long texts fetch rows x layers x heads x tokens^2 numbers.
            mapped = iter(self.run_batch([item for item, a in zip(items, asked, strict=True) if a], busy))
            plain = iter(self.run_batch([item for item, a in zip(items, asked, strict=True) if not a], busy))
            return [next(mapped) if a else next(plain) for a in asked]
        lengths = [len(item.ids) for item in items]
        return run_in_groups(lengths, lambda group: self._run([items[i] for i in group], busy))

    def _run(self, items: list[ClassifyItem], busy: bool) -> list[tuple[np.ndarray, list[np.ndarray] | None]]:
        types = [item.type_ids for item in items] if self.token_types else None
        feeds = encoder_feeds([item.ids for item in items], types, self.pad)
        attention = self.attention_names if items[0].attention else []
        out = self.session.run(feeds, [LOGITS, *attention], busy=busy)
        logits = np.asarray(out[LOGITS], dtype=np.float64)
        results = []
        for b, item in enumerate(items):
            n = len(item.ids)
            maps = [out[name][b, :, :n, :n] for name in attention] if item.attention else None
            results.append((logits[b], maps))
        return results

    def result(
        self, item: ClassifyItem, logits: np.ndarray, maps: list[np.ndarray] | None, top_k: int | None
    ) -> Classification:
        probs = label_probabilities(logits)
        best = int(np.argmax(probs))
        order = np.argsort(-probs, kind="stable")[: top_k or 0]
        attention = None
        if maps is not None:
            tokens = [self.tokenizer.id_to_token(t) for t in item.ids]
            attention = {"tokens": tokens, "layers": [to_json(a) for a in maps]}
        return Classification(
            label=self.labels[best],
            score=float(probs[best]),
            scores={label: float(p) for label, p in zip(self.labels, probs, strict=True)},
            logits=[float(x) for x in logits],
            top_k=[(self.labels[i], float(probs[i])) for i in order] if top_k else None,
            input_tokens=len(item.ids),
            attention=attention,
        )


class ClassificationService(TaskService[ClassificationSequence]):
    """Validates and tokenizes a classification job; one sequence per text, on the model's scheduler."""

    task: ClassVar[str] = CLASSIFICATION.name

    def __init__(self, artifact: Artifact, session: GraphSession, settings: Settings, metrics: Metrics) -> None:
        super().__init__(artifact, settings)
        self.labels = list(artifact.labels)
        self.model = ClassificationModel(artifact, session, self.tokenizer)
        self.scheduler = Scheduler.from_settings(self.name, self.model, settings, metrics)

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), labels=tuple(self.labels))

    @property
    def max_tokens(self) -> int:
        return min(self.settings.max_input_tokens, self.artifact.max_positions)

    def _encode(self, item: ClassifyInput) -> Encoding:
        return self.tokenizer.encode(item) if isinstance(item, str) else self.tokenizer.encode(item[0], item[1])

    def tokenize(
        self,
        inputs: list[ClassifyInput],
        fields: list[str],
        attention: bool,
        encoded: list[Encoding | int] | None = None,
    ) -> list[ClassifyItem]:
        """`encoded`: the inputs' `encode` (past the limit, a count), made off the event loop; else made here."""
        if encoded is None:
            encoded = self.encode_now(inputs, self.max_tokens)
        items = []
        for field_name, item, encoding in zip(fields, inputs, encoded, strict=True):
            parts = (item,) if isinstance(item, str) else item
            if any(not part.strip() for part in parts):
                raise InvalidInput("the text is empty", field_name)
            if isinstance(encoding, int):
                raise InvalidInput(too_long(encoding, self.max_tokens), field_name)
            if attention:
                check_length(len(encoding.ids))
            items.append(ClassifyItem(encoding.ids, encoding.type_ids, attention))
        return items

    async def warmup(self) -> None:
        """A single text, a pair, and a full batch, truncated to the limits."""

        def item(text: ClassifyInput) -> ClassificationSequence:
            encoding = self._encode(text)
            ids, types = encoding.ids[: self.max_tokens], encoding.type_ids[: self.max_tokens]
            return ClassificationSequence(ClassifyItem(ids, types, False), None)

        size = min(self.settings.max_batch_size, self.settings.max_queue_size, 8)
        full = [item("warm up the server " * (i + 1)) for i in range(size)]
        for batch in ([item("warm up")], [item(("warm up", "the server"))], full):
            await self.scheduler.submit(batch, None, "text").results()

    async def submit(self, job: ClassificationJob) -> Handle[Classification, Classification]:
        if job.top_k is not None and job.top_k > len(self.labels):
            raise InvalidInput(f"must be <= the number of labels ({len(self.labels)})", "top_k")
        if job.return_attention and not self.model.attention_names:
            raise InvalidInput("this model's graph does not export attention weights", "return_attention")
        direction = job.truncation_direction if job.truncate else None
        encoded = await self.encode(job.inputs, self.max_tokens, direction)
        items = self.tokenize(job.inputs, job.fields, job.return_attention, encoded)
        if job.return_attention:
            per_token2 = len(self.model.attention_names) * self.artifact.n_heads
            check_budget(per_token2 * sum(len(item.ids) ** 2 for item in items), self.settings.max_attention_values)
        sequences = [ClassificationSequence(item, job.top_k) for item in items]
        return self.scheduler.submit(sequences, self.deadline(), list_field(job.fields))
