"""The generation service: what the engine hands a generation request to. It validates and tokenizes,
builds one sequence per (prompt, choice), and queues them on the model's scheduler."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor

from service.engine.attention import check_budget, check_length
from service.engine.errors import InvalidInput
from service.engine.generation import GenerationModel, GenerationParams, GenerationResult, GenerationSequence, TokenEvent
from service.engine.metrics import Metrics
from service.engine.sampling import SamplingParams
from service.engine.scheduler import Scheduler, collect
from service.engine.scoring import PromptScorer
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession
from service.settings import Settings

DEFAULT_MAX_NEW_TOKENS = 64
WARMUP_PROMPTS = ("Warm up", "Warm up the server with a longer prompt, one that needs more tokens.")


class GenerationService:
    """What the API calls: validate and tokenize, queue, and read the sequence's events."""

    def __init__(
        self, artifact: Artifact, session: GraphSession, settings: Settings, executor: Executor, metrics: Metrics
    ) -> None:
        self.artifact = artifact
        self.name = artifact.name
        self.settings = settings
        self.tokenizer = artifact.load_tokenizer()
        self.model = GenerationModel(self.name, artifact, session, self.tokenizer, metrics)
        self.scheduler = Scheduler.from_settings(self.name, self.model, settings, executor, metrics)
        a = artifact
        shape = {"n_layers": a.n_decoder_layers, "n_heads": a.n_heads, "d_head": a.d_head, "pad": self.model.pad}
        self.scorer = PromptScorer(self.name, session, settings, executor, **shape)

    @property
    def max_prompt_tokens(self) -> int:
        return min(self.settings.max_input_tokens, self.artifact.max_positions - 1)

    def tokenize(self, prompt: str | list[int], field: str) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt).ids
        else:
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.artifact.vocab_size]
            if bad:
                raise InvalidInput(
                    f"token ids {bad[:5]} are outside the vocabulary (0..{self.artifact.vocab_size - 1})", field
                )
        if not ids:
            raise InvalidInput("the prompt is empty", field)
        if len(ids) > self.max_prompt_tokens:
            raise InvalidInput(f"the prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}", field)
        return ids

    def new_tokens(self, prompt_ids: list[int], requested: int | None) -> int:
        """The request's max_new_tokens: checked against the server cap; more than the model's context has
        room for is clamped to that room (the sequence ends with finish_reason "length"), unless
        SERVE_STRICT_MAX_TOKENS makes it a 422."""
        room = self.artifact.max_positions - len(prompt_ids)
        if requested is None:
            return max(1, min(DEFAULT_MAX_NEW_TOKENS, self.settings.max_new_tokens, room))
        if requested > self.settings.max_new_tokens:
            raise InvalidInput(f"must be <= {self.settings.max_new_tokens} (SERVE_MAX_NEW_TOKENS)", "max_new_tokens")
        if requested > room:
            if not self.settings.strict_max_tokens:  # as vLLM/OpenAI clients expect: fill the context, "length"
                return room
            raise InvalidInput(
                f"the prompt ({len(prompt_ids)} tokens) plus {requested} new tokens exceeds the model's "
                f"context of {self.artifact.max_positions} positions (SERVE_STRICT_MAX_TOKENS)",
                "max_new_tokens",
            )
        return requested

    def check_options(self, params: GenerationParams) -> None:
        bad = [t for t in params.sampling.logit_bias if not 0 <= t < self.artifact.vocab_size]
        if bad:
            raise InvalidInput(f"token ids {bad[:5]} are outside the vocabulary", "logit_bias")
        if params.return_attention and not self.model.attention_names:
            raise InvalidInput("this model's graph does not export attention weights", "return_attention")

    def sequence(self, prompt_ids: list[int], params: GenerationParams) -> GenerationSequence:
        self.check_options(params)
        if params.return_attention:
            tokens = len(prompt_ids) + params.max_new_tokens
            check_length(tokens)
            values = len(self.model.attention_names) * self.artifact.n_heads * tokens**2
            check_budget(values, self.settings.max_attention_values)
        return GenerationSequence(prompt_ids, params)

    def submit(self, sequences: list[GenerationSequence]) -> None:
        self.scheduler.submit(list(sequences))

    def deadline(self) -> float:
        return time.monotonic() + self.settings.request_timeout_s

    async def warmup(self) -> None:
        """A short and a longer prompt in one batch, then a lone one, truncated to the limits."""
        prompts = [ids[: self.max_prompt_tokens] for ids in (self.tokenizer.encode(t).ids for t in WARMUP_PROMPTS)]
        for batch in (prompts, prompts[:1]):
            params = GenerationParams(
                max_new_tokens=min(4, self.settings.max_new_tokens), sampling=SamplingParams(seed=0)
            )
            sequences = [GenerationSequence(ids, params) for ids in batch]
            self.submit(sequences)
            await collect([self.result(seq, None) for seq in sequences])

    async def result(self, seq: GenerationSequence, deadline: float | None) -> GenerationResult:
        result = None
        async for event in seq.stream(deadline):
            if isinstance(event, GenerationResult):
                result = event
        assert result is not None, "a sequence ended without a result"
        return result

    def events(self, seq: GenerationSequence, deadline: float | None) -> AsyncIterator[TokenEvent | GenerationResult]:
        return seq.stream(deadline)
