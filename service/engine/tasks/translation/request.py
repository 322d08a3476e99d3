"""What a translation request asks and gets back: its parameters, the sequence the scheduler queues, the
streamed pieces and the result (service/engine/tasks/translation/decoding.py decodes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.engine.sequence import Sequence
from service.engine.tokens.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
DEFAULT_BEAMS = 4  # the model card measures beam search with 4 (artifacts/translator/card.md)
MAX_BEAMS = 16  # beams are batch rows: SERVE_MAX_BATCH_SIZE caps them too


@dataclass(frozen=True)
class TranslationParams:
    num_beams: int = DEFAULT_BEAMS
    n_best: int = 1
    length_penalty: float = 1.0  # score = sum(logprob) / length ** length_penalty, the end token counted
    max_new_tokens: int | None = None  # None: 2 * source length + 16, within the server cap
    no_repeat_ngram_size: int = 3  # the model card measures beam 4 with this ban (artifacts/translator/card.md)
    sampling: SamplingParams | None = None  # num_beams=1: temperature, penalties, logit bias; None: greedy
    return_attention: bool = False
    stream: bool = False  # emit a TranslationPiece per token (num_beams=1 only: beams change their past)
    stop: tuple[str, ...] = ()  # num_beams=1: the text ends before the first of these


@dataclass(frozen=True)
class Hypothesis:
    text: str
    score: float
    logprob: float
    token_ids: list[int]  # without the end token


@dataclass(frozen=True)
class TranslationPiece:
    """One streamed target token and the text it completes ("" while a character is incomplete)."""

    index: int
    id: int
    text: str
    logprob: float | None = None


@dataclass(frozen=True)
class TranslationResult:
    hypotheses: list[Hypothesis]  # best first, n_best of them
    input_tokens: int
    attention: dict[str, Any] | None = None
    tail: str = ""  # streamed text the end released (an incomplete character); in the text, in no piece


class TranslationSequence(Sequence):
    def __init__(
        self, src_ids: list[int], params: TranslationParams, max_new_tokens: int, forced_first: int | None = None
    ) -> None:
        super().__init__(rows=params.num_beams, prefill_tokens=len(src_ids))
        self.src_ids = src_ids
        self.params = params
        self.max_new_tokens = max_new_tokens
        self.forced_first = forced_first  # a multilingual model's target language: the first token, logprob 0
