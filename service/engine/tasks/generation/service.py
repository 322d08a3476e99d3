"""The generation service: what the engine hands a generation job to. It validates and tokenizes, builds
one sequence per (prompt, choice), and queues them on the model's scheduler."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import ClassVar, cast

from tokenizers import Encoding

from contract.kinds import GENERATION
from service.engine.attention import check_budget, check_length
from service.engine.cache.in_place import InPlaceDecoder
from service.engine.capabilities import Capabilities
from service.engine.errors import InvalidInput
from service.engine.handle import Handle
from service.engine.metrics import Metrics
from service.engine.scheduling import Scheduler
from service.engine.sequence import DecodeModel
from service.engine.task_service import TaskService, list_field
from service.engine.tasks.generation.chat_template import ChatMessages, ChatTemplate
from service.engine.tasks.generation.constraints import CompiledGrammar, Constraint
from service.engine.tasks.generation.decoding import (
    GenerationModel,
    GenerationParams,
    GenerationResult,
    GenerationSequence,
    TokenEvent,
)
from service.engine.tasks.generation.scoring import PromptScorer, Scorer, TokenScore
from service.engine.tokens.sampling import SamplingParams, with_model_defaults
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession
from service.settings import Settings

DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class GenerationJob:
    """A generation request: `n` choices per prompt (choice i of prompt j is sequence j * n + i, as OpenAI
    numbers them), each with the job's options; `fields` names each prompt in errors."""

    task: ClassVar[str] = GENERATION.name
    prompts: list[str | list[int]]
    fields: list[str]
    max_new_tokens: int | None = None  # None: the default; 0: nothing is generated (echo only)
    sampling: SamplingParams = field(default_factory=SamplingParams)  # choice i gets seed + i
    # The sampling settings the request set; the model's defaults (generation_config.json) fill the others.
    # None: `sampling` is complete as it is (protocols whose omitted fields mean fixed values, as TGI's).
    sampling_given: frozenset[str] | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and the k most likely
    return_attention: bool = False
    n: int = 1
    truncate: int | None = None  # keep the last `truncate` prompt tokens (TGI's parameter)
    score_prompts: int | None = None  # also score every prompt token, with this many top logprobs
    model: str | None = None  # None: the task's default model
    add_special_tokens: bool = True  # false for a rendered chat: its template wrote the special tokens
    # Without max_new_tokens and a model default: fill the context (OpenAI's and vLLM's chat), not
    # DEFAULT_MAX_NEW_TOKENS; SERVE_MAX_NEW_TOKENS still caps it.
    fill_context_by_default: bool = False
    constraint: Constraint | None = None  # what every choice must match (constraints.py)
    chat: ChatMessages | None = None  # rendered by the model's chat template into the one prompt


class GenerationHandle(Handle[TokenEvent, GenerationResult]):
    """A generation job's handle; with `score_prompts`, the prompts' token scores too."""

    scores: asyncio.Future[list[list[TokenScore]]] | None = None

    async def prompt_scores(self) -> list[list[TokenScore]] | None:
        if self.scores is None:
            return None
        try:
            return await self.scores
        except BaseException:
            self.cancel()  # a failed or abandoned scoring ends the whole job
            raise

    def cancel(self) -> None:
        super().cancel()
        if self.scores is not None:
            self.scores.cancel()


class GenerationService(TaskService[GenerationSequence]):
    task: ClassVar[str] = GENERATION.name
    warmup_texts = ("Warm up", "Warm up the server with a longer prompt, one that needs more tokens.")

    def __init__(self, artifact: Artifact, session: GraphSession, settings: Settings, metrics: Metrics) -> None:
        super().__init__(artifact, settings)
        in_place = InPlaceDecoder.for_session(self.name, session, artifact, settings, metrics)
        self.model = GenerationModel(self.name, artifact, session, self.tokenizer, metrics, in_place)
        # Its batches are typed over the base Sequence; it only ever gets back the GenerationSequences queued here.
        model = cast("DecodeModel[GenerationSequence]", self.model)
        scheduler = Scheduler.from_settings(self.name, model, settings, metrics)
        self.scheduler = scheduler
        shape = (artifact.n_decoder_layers, artifact.n_kv_heads, artifact.d_head)
        # Scoring runs on the scheduler's worker thread, between steps: one thread per session.
        self.scorer: Scorer = PromptScorer(self.name, session, settings, scheduler.executor, shape, self.model.pad)
        # Compiled once; None for a model without one (our own generator): chat requests are refused.
        self.chat_template = (
            ChatTemplate(
                artifact.chat_template,
                settings.chat_template_timeout_s,
                settings.chat_template_memory_mb << 20,
                4 * settings.max_body_bytes,  # the messages themselves are within the body
            )
            if artifact.chat_template is not None
            else None
        )

    def capabilities(self) -> Capabilities:
        source = self.chat_template.source if self.chat_template is not None else None
        return replace(
            super().capabilities(), max_input_tokens=self.max_prompt_tokens, chat_template=source, end_id=self.model.eos
        )

    @property
    def max_prompt_tokens(self) -> int:
        return min(self.settings.max_input_tokens, self.artifact.max_positions - 1)

    @property
    def max_scored_tokens(self) -> int:
        """A prompt that is only scored (echo, max_tokens 0) may fill the context: no position is left to
        generate into."""
        return min(self.settings.max_input_tokens, self.artifact.max_positions)

    def tokenize(
        self,
        prompt: str | list[int],
        field: str,
        truncate: int | None = None,
        limit: int | None = None,
        encoded: Encoding | int | None = None,
    ) -> list[int]:
        """The prompt's ids, refused (never cut) beyond `limit` (default max_prompt_tokens): only TGI's
        explicit `truncate` drops tokens, from the start. `encoded`: a text prompt's `encode` (past the
        limit, a count), made off the event loop; else made here."""
        limit = self.max_prompt_tokens if limit is None else limit
        if isinstance(prompt, str):
            if encoded is None:
                [encoded] = self.encode_now([prompt], None if truncate is not None else limit)
            if isinstance(encoded, int):
                raise InvalidInput(self._too_long(encoded, limit), field)
            ids = encoded.ids
        else:
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.artifact.vocab_size]
            if bad:
                raise InvalidInput(
                    f"token ids {bad[:5]} are outside the vocabulary (0..{self.artifact.vocab_size - 1})", field
                )
        if truncate is not None:
            ids = ids[-truncate:]
        if not ids:
            raise InvalidInput("the prompt is empty", field)
        if len(ids) > limit:
            raise InvalidInput(self._too_long(len(ids), limit), field)
        return ids

    def _too_long(self, tokens: int, limit: int) -> str:
        """A prompt past `limit`: what sets the limit, and the context length to give a client that cuts
        prompts to one itself (lm-eval's max_length, 2048 unless told, sends longer ones to a small model)."""
        positions, cap = self.artifact.max_positions, self.settings.max_input_tokens
        if cap <= limit:
            why = "SERVE_MAX_INPUT_TOKENS"
        elif limit == positions:
            why = f"the model's context of {positions} positions"
        else:
            why = f"the model's context of {positions} positions, less {positions - limit} for new tokens"
        context = min(cap + 1, positions)  # a prompt of context - 1 tokens, and one new token
        return (
            f"the prompt has {tokens} tokens; the limit is {limit} ({why}); a client that cuts prompts to a context "
            f"length needs {context} (lm-evaluation-harness: --model_args max_length={context})"
        )

    def new_tokens(self, prompt_ids: list[int], requested: int | None, fill_context: bool = False) -> int:
        """The request's max_new_tokens. More than the model's context has room for is clamped to that room
        (the sequence ends with finish_reason "length"), unless SERVE_STRICT_MAX_TOKENS makes it a 422.
        The clamp comes before the server cap (SERVE_MAX_NEW_TOKENS): a budget beyond the context means "as
        much as fits", and only what fits must be within the cap."""
        room = self.artifact.max_positions - len(prompt_ids)
        if requested is None:  # the model's own default (generation_config.json) where it has one
            default = int(
                self.artifact.generation_defaults.get(
                    "max_new_tokens", room if fill_context else DEFAULT_MAX_NEW_TOKENS
                )
            )
            return max(1, min(default, self.settings.max_new_tokens, room))
        if requested > room:
            if self.settings.strict_max_tokens:
                raise InvalidInput(
                    f"the prompt ({len(prompt_ids)} tokens) plus {requested} new tokens exceeds the model's "
                    f"context of {self.artifact.max_positions} positions (SERVE_STRICT_MAX_TOKENS)",
                    "max_new_tokens",
                )
            requested = room  # as vLLM/OpenAI clients expect: fill the context, "length"
        if requested > self.settings.max_new_tokens:
            raise InvalidInput(f"must be <= {self.settings.max_new_tokens} (SERVE_MAX_NEW_TOKENS)", "max_new_tokens")
        return requested

    def sequence(self, prompt_ids: list[int], params: GenerationParams) -> GenerationSequence:
        bad = [t for t in params.sampling.logit_bias if not 0 <= t < self.artifact.vocab_size]
        if bad:
            raise InvalidInput(f"token ids {bad[:5]} are outside the vocabulary", "logit_bias")
        if params.return_attention and not self.model.attention_names:
            raise InvalidInput("this model's graph does not export attention weights", "return_attention")
        if params.return_attention:
            tokens = len(prompt_ids) + params.max_new_tokens
            check_length(tokens)
            values = len(self.model.attention_names) * self.artifact.n_heads * tokens**2
            check_budget(values, self.settings.max_attention_values)
        return GenerationSequence(prompt_ids, params)

    def _sequences(
        self, job: GenerationJob, prompt_ids: list[list[int]], grammar: CompiledGrammar | None
    ) -> list[GenerationSequence]:
        if job.max_new_tokens == 0:
            return []
        sequences = []
        chosen = with_model_defaults(job.sampling, self.artifact.generation_defaults, job.sampling_given)
        for ids in prompt_ids:
            max_new = self.new_tokens(ids, job.max_new_tokens, job.fill_context_by_default)
            for i in range(job.n):
                seed = chosen.seed
                sampling = chosen if seed is None or i == 0 else replace(chosen, seed=seed + i)
                params = GenerationParams(
                    max_new_tokens=max_new,
                    sampling=sampling,  # choices differ, yet are reproducible
                    stop=job.stop,
                    ignore_eos=job.ignore_eos,
                    logprobs=job.logprobs,
                    return_attention=job.return_attention,
                    constraint=grammar,
                )
                sequences.append(self.sequence(ids, params))
        return sequences

    async def submit(self, job: GenerationJob) -> GenerationHandle:
        """Validate and queue the whole job, or raise (422, 429) with nothing queued."""
        if job.chat is not None:
            job = replace(job, prompts=[await self.render(job.chat)], add_special_tokens=False)
        limit = self.max_scored_tokens if job.max_new_tokens == 0 else self.max_prompt_tokens
        texts = [p for p in job.prompts if isinstance(p, str)]
        cut = None if job.truncate is not None else limit
        encoded = iter(await self.encode(texts, cut, add_special_tokens=job.add_special_tokens) if texts else ())
        prompt_ids = [
            self.tokenize(p, f, job.truncate, limit, next(encoded) if isinstance(p, str) else None)
            for p, f in zip(job.prompts, job.fields, strict=True)
        ]
        grammar = None
        if job.constraint is not None and job.max_new_tokens != 0:
            grammar = await asyncio.to_thread(self.model.grammars.compile, job.constraint)  # cached after the first
        sequences = self._sequences(job, prompt_ids, grammar)
        many = "n" if job.n > 1 else list_field(job.fields)
        deadline = self.deadline()
        handle = self.scheduler.submit(sequences, deadline, many, GenerationHandle)
        handle.prompt_ids = prompt_ids
        if job.score_prompts is not None:
            handle.scores = asyncio.ensure_future(self.scorer.score(prompt_ids, job.score_prompts, deadline))
        return handle

    async def render(self, chat: ChatMessages) -> str:
        """The prompt text, rendered in the template's sandbox process (bounded in time and memory) from a
        worker thread, so that the event loop (and every stream on it) never waits for a template."""
        if self.chat_template is None:
            raise InvalidInput(f"model {self.name!r} has no chat template to render chat messages", "messages")
        return await asyncio.to_thread(self.chat_template.render, chat.messages, chat.tools)

    async def warmup(self) -> None:
        """A short and a longer prompt in one batch, then a lone one, truncated to the limits."""
        prompts = self.warmup_ids(self.max_prompt_tokens)
        for batch in (prompts, prompts[:1]):
            job = GenerationJob(
                list(batch),
                ["prompt"] * len(batch),
                max_new_tokens=min(4, self.settings.max_new_tokens),
                sampling=SamplingParams(seed=0),
            )
            await (await self.submit(job)).results()
