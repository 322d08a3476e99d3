"""The translation service: what the engine hands a translation job to. It validates and tokenizes,
builds one sequence per source text, and queues them on the model's scheduler."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, cast

from tokenizers import Encoding

from contract.kinds import TRANSLATION
from service.engine.attention import check_budget, check_length
from service.engine.capabilities import Capabilities
from service.engine.errors import InvalidInput
from service.engine.handle import Handle
from service.engine.metrics import Metrics
from service.engine.scheduling import Scheduler
from service.engine.sequence import DecodeModel
from service.engine.task_service import TaskService, list_field
from service.engine.tasks.translation.decoding import (
    TranslationModel,
    TranslationParams,
    TranslationPiece,
    TranslationResult,
    TranslationSequence,
)
from service.engine.tasks.translation.languages import Languages
from service.engine.tasks.translation.request import MAX_BEAMS
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession
from service.settings import Settings


@dataclass(frozen=True)
class TranslationJob:
    """A translation request: one sequence per text; `fields` names each text in errors. With
    `params.stream`, one text whose events are a TranslationPiece per target token, then its result."""

    task: ClassVar[str] = TRANSLATION.name
    texts: list[str]
    fields: list[str]
    params: TranslationParams
    model: str | None = None  # None: the task's default model
    source_lang: str | None = None  # a multilingual model's language codes (languages.py)
    target_lang: str | None = None


class TranslationService(TaskService[TranslationSequence]):
    task: ClassVar[str] = TRANSLATION.name
    warmup_texts = ("Warm up.", "Warm up the server with a longer sentence, one that needs more tokens.")

    def __init__(
        self, artifact: Artifact, encoder: GraphSession, decoder: GraphSession, settings: Settings, metrics: Metrics
    ) -> None:
        super().__init__(artifact, settings)
        self.model = TranslationModel(self.name, artifact, encoder, decoder, self.tokenizer, metrics)
        # Its batches are typed over the base Sequence; it only ever gets back the TranslationSequences queued here.
        model = cast("DecodeModel[TranslationSequence]", self.model)
        self.scheduler = Scheduler.from_settings(self.name, model, settings, metrics)
        self.languages = Languages(artifact.languages, artifact.forced_bos_token_id, artifact.special_tokens["eos"])

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), max_target_tokens=self.max_target_tokens)

    @property
    def max_source_tokens(self) -> int:
        return min(self.settings.max_input_tokens, self.artifact.max_positions)

    @property
    def max_target_tokens(self) -> int:
        return min(self.settings.max_new_tokens, self.artifact.max_positions - 1)  # bos takes position 0

    def check(self, params: TranslationParams, items: int) -> None:
        if params.num_beams > min(MAX_BEAMS, self.settings.max_batch_size):
            limit = min(MAX_BEAMS, self.settings.max_batch_size)
            raise InvalidInput(f"must be <= {limit} (beams are batch rows; SERVE_MAX_BATCH_SIZE)", "num_beams")
        if params.n_best > params.num_beams:
            raise InvalidInput(f"must be <= num_beams ({params.num_beams})", "n_best")
        if params.num_beams > 1 and params.sampling is not None:  # beam search scores the model's own logprobs
            if not params.sampling.greedy:
                raise InvalidInput("sampling works with num_beams=1 only", "do_sample")
            raise InvalidInput("penalties and logit bias work with num_beams=1 only", "repetition_penalty")
        if params.num_beams > 1 and params.stop:
            raise InvalidInput("stop strings work with num_beams=1 only", "stop")
        if params.stream and params.num_beams > 1:
            raise InvalidInput("streaming works with num_beams=1 only (beam search revises earlier tokens)", "stream")
        if params.stream and items > 1:
            raise InvalidInput("streaming takes one text per request", "text")
        if params.max_new_tokens is not None and params.max_new_tokens > self.max_target_tokens:
            raise InvalidInput(f"must be <= {self.max_target_tokens}", "max_new_tokens")
        if params.return_attention and not self.model.decoder_attention:
            raise InvalidInput("this model's graphs do not export attention weights", "return_attention")

    def tokenize(
        self, texts: list[str], fields: list[str], encoded: list[Encoding | int] | None = None
    ) -> list[list[int]]:
        """`encoded`: the texts' `encode` (past the limit, a count), made off the event loop; else made here."""
        if encoded is None:
            encoded = self.encode_now(texts, self.max_source_tokens)
        ids = []
        for field_name, text, encoding in zip(fields, texts, encoded, strict=True):
            if not text.strip() or (not isinstance(encoding, int) and not len(encoding)):
                raise InvalidInput("the text is empty", field_name)
            if isinstance(encoding, int):
                raise InvalidInput(f"the text has {encoding} tokens; the limit is {self.max_source_tokens}", field_name)
            ids.append(encoding.ids)
        return ids

    async def warmup(self) -> None:
        """Greedy and beam search over a short and a longer source, truncated to the limits."""
        sources = self.warmup_ids(self.max_source_tokens)
        for beams in sorted({1, min(2, self.settings.max_batch_size)}):
            params = TranslationParams(num_beams=beams)
            forced = self.languages.default_target
            if forced is None and self.languages.codes:  # any language: warm-up output is discarded
                forced = next(iter(self.languages.codes.values()))
            sequences = [TranslationSequence(src, params, min(4, self.max_target_tokens), forced) for src in sources]
            await self.scheduler.submit(sequences, None, "text").results()

    async def submit(self, job: TranslationJob) -> Handle[TranslationPiece, TranslationResult]:
        """Validate and queue the whole job, or raise (422, 429) with nothing queued."""
        params = job.params
        self.check(params, len(job.texts))
        forced = self.languages.target(job.target_lang)
        if job.source_lang is not None:
            self.languages.token(job.source_lang, "source_lang")  # refused before the texts are tokenized
        sources = self.tokenize(job.texts, job.fields, await self.encode(job.texts, self.max_source_tokens))
        sources = [self.languages.source(src, job.source_lang) for src in sources]
        sequences = [
            TranslationSequence(
                src, params, params.max_new_tokens or min(2 * len(src) + 16, self.max_target_tokens), forced
            )
            for src in sources
        ]
        if params.return_attention:
            for seq in sequences:
                check_length(len(seq.src_ids) + seq.max_new_tokens)
            n_enc, n_dec, heads = len(self.model.encoder_attention), self.model.n_layers, self.artifact.n_heads
            values = sum(  # encoder self, decoder self and cross attention of each text's best hypothesis
                heads * (n_enc * len(s.src_ids) ** 2 + n_dec * s.max_new_tokens * (s.max_new_tokens + len(s.src_ids)))
                for s in sequences
            )
            check_budget(values, self.settings.max_attention_values)
        handle = self.scheduler.submit(sequences, self.deadline(), list_field(job.fields))
        handle.prompt_ids = sources
        return handle
