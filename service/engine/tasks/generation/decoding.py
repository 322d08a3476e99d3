"""Decoder-only generation with continuous batching and a KV cache.

`GenerationModel.prefill` runs the prompts of newcomers as one left-padded batch (empty past), or
`start_prefill` feeds them a chunk of columns per scheduler step while others decode, and samples
their first token; `GenerationBatch.step` feeds one token per row against the cache. Tokens are
chosen for the whole batch at once (`chooser`), each row with its own seed, and each row keeps its own
detokenizer, so its tokens do not depend on its neighbours. The end token ends a row without being one
of its tokens (`stopping`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from contract.names import ATTENTIONS, PRESENT, layer_names
from service.engine.attention import stack_rows, to_json
from service.engine.cache.appended import KVCache, kv_names
from service.engine.cache.in_place import InPlaceDecoder
from service.engine.cache.slots import SlotHold
from service.engine.metrics import Metrics, finished_reason
from service.engine.sequence import Emit, Sequence
from service.engine.tasks.generation.constraints import (
    CLOSING_WINDOW,
    Closing,
    CompiledGrammar,
    Grammars,
    closing_scores,
    closing_token,
    fill_masks,
)
from service.engine.tasks.generation.prompts import PromptBatch, SlotPrompts, release_slots
from service.engine.tokens.batch import SequenceBatch
from service.engine.tokens.chooser import Choice, ChooserRows, choose
from service.engine.tokens.sampling import SamplingParams
from service.engine.tokens.stopping import END, StopRows, release
from service.engine.tokens.streaming import TextStream
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and the k most likely
    return_attention: bool = False
    constraint: CompiledGrammar | None = None  # what the output must match (constraints.py)


@dataclass(frozen=True)
class TopLogprob:
    id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenEvent:
    index: int  # position in the completion
    id: int
    text: str  # text released by this token; "" while a character or a possible stop string is incomplete
    special: bool
    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None
    token: str = ""  # with logprobs: the token's own text (decoded alone), as OpenAI's logprobs show it


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: str  # eos | stop | length
    prompt_tokens: int
    completion_tokens: int  # len(tokens): the end token is not one
    seed: int
    tokens: list[TokenEvent]
    attention: dict[str, Any] | None = None
    tail: str = ""  # text the end token released (held back as a possible stop string); in `text`, in no event


class GenerationSequence(Sequence):
    def __init__(self, prompt_ids: list[int], params: GenerationParams) -> None:
        super().__init__(rows=1, prefill_tokens=len(prompt_ids))
        self.prompt_ids = prompt_ids
        self.params = params
        self.cache_tokens = len(prompt_ids) + params.max_new_tokens


class _Row:
    """Worker-side state of one sequence."""

    def __init__(self, seq: GenerationSequence, model: GenerationModel) -> None:
        self.seq = seq
        self.params = seq.params
        self.text = TextStream(model.tokenizer, seq.params.stop)
        self.pieces: list[str] = []
        self.tokens: list[TokenEvent] = []
        self.tail = ""
        self.attention: list[list[np.ndarray]] = []  # per layer: query-row blocks [H, q, k]
        self.last_token_at: float | None = None
        self.first_token_at: float | None = None
        self.finished = False
        self.seed = 0
        constraint = seq.params.constraint
        self.matcher = model.grammars.matcher(constraint) if constraint is not None else None
        self.closing = Closing()  # closing its grammar's structure as its budget ends
        self.hold: SlotHold | None = None  # its slot of an in-place cache (cache/slots.py)


class GenerationModel:
    def __init__(
        self,
        name: str,
        artifact: Artifact,
        session: GraphSession,
        tokenizer: Tokenizer,
        metrics: Metrics,
        in_place: InPlaceDecoder | None = None,
    ) -> None:
        self.name = name
        if session.spec.writes_cache_in_place and in_place is None:
            raise ValueError(f"{name}: its graph writes its cache in place: pass InPlaceDecoder.for_session(...)")
        self.in_place = in_place  # where the graph writes its cache in place (cache/in_place.py)
        self.artifact = artifact
        self.session = session
        self.tokenizer = tokenizer
        self.ttft = metrics.time_to_first_token.labels(name)
        self.itl = metrics.inter_token_latency.labels(name)
        self.tokens = metrics.generated_tokens.labels(name)
        self.prompt_tokens = metrics.prompt_tokens.labels(name)
        self.finished = metrics.request_success
        self.prefill_time = metrics.prefill_time.labels(name)
        self.decode_time = metrics.decode_time.labels(name)
        self.time_per_output_token = metrics.time_per_output_token.labels(name)
        self.vocab_size = artifact.vocab_size
        self.eos = artifact.special_tokens["eos"]
        self.end_tokens = np.asarray(artifact.end_tokens, dtype=np.int64)  # eos, or all of a model's end tokens
        self.banned_tokens = np.asarray(artifact.banned_token_ids, dtype=np.int64)  # the model's bad_words_ids
        self.pad = artifact.special_tokens["pad"]
        self.special_ids = set(artifact.special_tokens.values()) | set(artifact.end_tokens)
        self.n_layers = artifact.n_decoder_layers
        self.present = kv_names(PRESENT, self.n_layers)
        names = layer_names(ATTENTIONS, self.n_layers)
        self.attention_names = names if all(session.has_output(n) for n in names) else []
        self.grammars = Grammars(tokenizer, self.vocab_size, list(artifact.end_tokens))
        self._closing_scores: np.ndarray | None = None

    # --- the key/value cache's memory budget (CacheBudgeted; the in-place cache only) ----------------------

    @property
    def cache_budget(self) -> int | None:
        return self.in_place.budget if self.in_place is not None else None

    def cache_cost(self, seq: Sequence) -> int:
        return seq.cache_tokens * self.in_place.bytes_per_token if self.in_place is not None else 0

    def cache_room(self, running: Iterable[Sequence], wanted: int) -> int:
        assert self.in_place is not None, "asked only where there is a budget"
        return self.in_place.room(sum(self.cache_cost(seq) for seq in running), wanted)

    def cache_usage(self) -> float:
        return self.in_place.cached_bytes / self.in_place.budget if self.in_place is not None else 0.0

    def closing_scores(self) -> np.ndarray:
        if self._closing_scores is None:  # on the first row that needs them: a pass over the vocabulary
            self._closing_scores = closing_scores(self.tokenizer, self.vocab_size)
        return self._closing_scores

    def run(
        self, input_ids: np.ndarray, cache: KVCache, new_mask: np.ndarray, attention: bool
    ) -> tuple[np.ndarray, KVCache, list[np.ndarray]]:
        """One graph call: last-position logits [B, V], the advanced cache, attention maps if asked."""
        wanted = ["logits", *self.present, *(self.attention_names if attention else [])]
        feeds = {"input_ids": input_ids, **cache.feeds(new_mask), **self.session.last_logits_only}
        out = self.session.run(feeds, wanted, keep=self.present)
        attn = [out[n] for n in self.attention_names] if attention else []
        return out["logits"][:, -1], cache.advance(out, new_mask), attn

    def prefill(self, sequences: list[Sequence]) -> tuple[list[Emit], GenerationBatch | None]:
        """The newcomers' whole prompts in one call: their first tokens and their decode batch."""
        finished = self.start_prefill(sequences).advance(None)
        assert finished is not None
        return finished

    def start_prefill(self, sequences: list[Sequence]) -> PromptBatch | SlotPrompts:
        """The newcomers' prompts, to be fed a chunk per scheduler step (`PromptBatch.advance`)."""
        rows = [_Row(seq, self) for seq in sequences if isinstance(seq, GenerationSequence)]
        return SlotPrompts(self, self.in_place, rows) if self.in_place is not None else PromptBatch(self, rows)

    def first_tokens(
        self, rows: list[_Row], logits: np.ndarray, cache: KVCache | None, attn: list[np.ndarray], padded: int
    ) -> tuple[list[Emit], GenerationBatch | None]:
        """After the last prompt chunk: choose each row's first token; the batch of those that go on.
        `attn` holds the whole prompt's maps when a row asked for them (its prompt then ran in one call)."""
        for b, row in enumerate(rows):
            if row.params.return_attention:
                n = len(row.seq.prompt_ids)
                # [H, n, n], copied: a view would keep the whole batch's maps for as long as the row decodes
                row.attention = [[a[b, :, padded - n :, padded - n :].copy()] for a in attn]
        params = [r.params for r in rows]
        sampling, logprobs = [p.sampling for p in params], [p.logprobs for p in params]
        prompts = [r.seq.prompt_ids for r in rows]
        chooser = ChooserRows.create(sampling, self.vocab_size, prompts, logprobs)
        for row, seed in zip(rows, chooser.seed.tolist(), strict=True):
            row.seed = seed
        stops = StopRows.create([p.max_new_tokens for p in params], [p.ignore_eos for p in params])
        batch = GenerationBatch(self, rows, cache, np.zeros((len(rows), 1), dtype=np.int64), chooser, stops)
        emits = batch.select(logits)
        return emits, batch.drop_finished()

    def result(self, row: _Row, reason: str) -> GenerationResult:
        self._record_finish(row, reason)
        attention = None
        if row.params.return_attention and row.attention:
            drawn = [t.id for t in row.tokens]
            fed = row.seq.prompt_ids + (drawn if reason == "eos" else drawn[:-1])  # the last one drawn was never fed
            layers = [stack_rows(blocks, len(fed)) for blocks in row.attention]
            attention = {"tokens": [self.tokenizer.id_to_token(t) for t in fed], "layers": [to_json(a) for a in layers]}
        return GenerationResult(
            text="".join(row.pieces),
            finish_reason=reason,
            prompt_tokens=len(row.seq.prompt_ids),
            completion_tokens=len(row.tokens),
            seed=row.seed,
            tokens=row.tokens,
            attention=attention,
            tail=row.tail,
        )

    def _record_finish(self, row: _Row, reason: str) -> None:
        self.prompt_tokens.inc(len(row.seq.prompt_ids))
        self.finished.labels(self.name, finished_reason(reason)).inc()
        if row.first_token_at is not None:
            if row.seq.admitted is not None:
                self.prefill_time.observe(row.first_token_at - row.seq.admitted)
            self.decode_time.observe(time.perf_counter() - row.first_token_at)
            if len(row.tokens) > 1 and row.last_token_at is not None:
                self.time_per_output_token.observe((row.last_token_at - row.first_token_at) / (len(row.tokens) - 1))

    def banned(self, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, tokens) pairs no row may draw: the model's bad_words_ids, in every row."""
        if not len(self.banned_tokens):
            return None
        return np.repeat(np.arange(rows), len(self.banned_tokens)), np.tile(self.banned_tokens, rows)

    def event(self, row: _Row, b: int, token: int, piece: str, choice: Choice) -> TokenEvent:
        """Row b's token event, with the logprobs the chooser computed if the row asked."""
        k = row.params.logprobs
        logprob, top = None, None
        if k is not None and choice.logprobs is not None:
            logprob = float(choice.logprobs[b])
            if k > 0 and choice.top_ids is not None and choice.top_logprobs is not None:
                ids, values = choice.top_ids[b, :k].tolist(), choice.top_logprobs[b, :k].tolist()
                top = [TopLogprob(t, self.tokenizer.decode([t]), v) for t, v in zip(ids, values, strict=True)]
        own = self.tokenizer.decode([token]) if k is not None else ""
        return TokenEvent(len(row.tokens), token, piece, token in self.special_ids, logprob, top, own)


@dataclass(eq=False, repr=False)  # one worker's state: compared by identity, its arrays never printed
class GenerationBatch(SequenceBatch[_Row]):
    model: GenerationModel
    items: list[_Row]  # one per batch row
    cache: KVCache | None  # None: each row holds a slot of the model's in-place cache
    next_ids: np.ndarray  # [B, 1]: the token each row feeds next
    chooser: ChooserRows
    stops: StopRows

    @property
    def entries(self) -> list[_Row]:
        return self.items

    def step(self) -> list[Emit]:
        try:
            emits = self.select(self._logits_in_place() if self.cache is None else self._logits_appended())
        except BaseException:
            release_slots(self.items)  # the worker drops a failed batch: its slots are free at once
            raise
        self.drop_finished()
        return emits

    def _logits_in_place(self) -> np.ndarray:
        assert self.model.in_place is not None
        slots = np.asarray([row.hold.slot for row in self.items if row.hold is not None])
        return self.model.in_place.step(slots, self.next_ids[:, 0])

    def _logits_appended(self) -> np.ndarray:
        assert self.cache is not None
        new_mask = np.ones((self.rows, 1), dtype=np.int64)
        want = any(r.params.return_attention for r in self.items)
        logits, self.cache, attn = self.model.run(self.next_ids, self.cache, new_mask, want)
        for b, row in enumerate(self.items):
            if row.params.return_attention:
                keys = self.cache.mask[b].astype(bool)  # drop left padding
                for layer, a in enumerate(attn):
                    row.attention[layer].append(a[b][:, :, keys])  # [H, 1, k]
        return logits

    def select(self, logits: np.ndarray) -> list[Emit]:
        """Choose every row's next token from [B, V] logits; emit it, and the result if the row is done."""
        m = self.model
        allowed, stuck = self._grammar_masks()
        choice = choose(self.chooser, logits, m.banned(self.rows), allowed)
        self.chooser.observe(choice.tokens)
        codes = self.stops.update(choice.tokens, m.end_tokens).tolist()
        self.next_ids[:, 0] = choice.tokens
        emits: list[Emit] = []
        now = time.perf_counter()
        for b, (row, token) in enumerate(zip(self.items, choice.tokens.tolist(), strict=True)):
            if b in stuck or (row.matcher is not None and not row.matcher.consume_token(token)):
                row.finished = True  # the grammar allows no token here: end rather than break it
                emits.append(Emit(row.seq, m.result(row, "error"), final=True))
                continue
            piece, reason = release(row.text, token, codes[b])
            if reason == "eos" and row.closing.narrowed:
                reason = "length"  # the budget, not the model, ended it
            row.pieces.append(piece)
            if codes[b] == END:
                row.tail = piece
            else:
                event = m.event(row, b, token, piece, choice)
                row.tokens.append(event)
                self._observe(row, now)
                if row.seq.wants_events:
                    emits.append(Emit(row.seq, event))
            if reason is not None:
                row.finished = True
                emits.append(Emit(row.seq, m.result(row, reason), final=True))
        m.tokens.inc(sum(code != END for code in codes))
        return emits

    def _grammar_masks(self) -> tuple[np.ndarray | None, set[int]]:
        """The tokens each row's grammar allows ([B, V], None when no row has one), and the rows whose grammar
        allows none (they are given every token, to keep the draw defined, and end)."""
        matchers = [row.matcher for row in self.items]
        if all(matcher is None for matcher in matchers):
            return None, set()
        m = self.model
        allowed = fill_masks(matchers, m.vocab_size)
        stuck = set(np.flatnonzero(~allowed.any(axis=1)).tolist())
        for b in stuck:
            allowed[b] = True
        left = (self.stops.max_new - self.stops.drawn).tolist()
        for b, row in enumerate(self.items):
            if row.matcher is None or b in stuck or (left[b] > CLOSING_WINDOW and not row.closing.active):
                continue
            # Its budget is nearly spent: once closing the structure takes all that is left, close it
            # (finish_reason "length": the budget, not the model, ended it).
            scores = m.closing_scores()
            if row.closing.due(row.matcher, allowed[b], left[b], scores, m.end_tokens):
                row.closing.narrowed |= bool(allowed[b].sum() > 1)
                token = closing_token(allowed[b], scores, m.end_tokens)
                allowed[b] = False
                allowed[b, token] = True
        return allowed, stuck

    def _observe(self, row: _Row, now: float) -> None:
        m = self.model
        if row.last_token_at is None:
            m.ttft.observe(now - row.seq.enqueued)
            row.first_token_at = now
        else:
            m.itl.observe(now - row.last_token_at)
        row.last_token_at = now

    def _take(self, keep: list[int]) -> GenerationBatch | None:
        kept = set(keep)
        release_slots([row for i, row in enumerate(self.items) if i not in kept])  # free for the next prompts
        if not keep:
            return None
        rows = np.asarray(keep, dtype=np.int64)
        return GenerationBatch(self.model, [self.items[i] for i in keep], **self._state_of(rows, rows))

    def drop_finished(self) -> GenerationBatch | None:
        keep = [i for i, r in enumerate(self.items) if not r.finished]
        if len(keep) < self.rows:
            taken = self._take(keep)
            if taken is None:
                self.items = []
                return None
            self.items, self.cache, self.next_ids = taken.items, taken.cache, taken.next_ids
            self.chooser, self.stops = taken.chooser, taken.stops
        return self

    def concatenate(self, other: Any) -> GenerationBatch:
        assert isinstance(other, GenerationBatch)
        return GenerationBatch(self.model, self.items + other.items, **self._state_with(other))
