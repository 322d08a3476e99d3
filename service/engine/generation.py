"""Decoder-only generation with continuous batching and a KV cache.

`GenerationModel.prefill` runs the prompts of newcomers as one left-padded batch (empty past) and
samples their first token; `GenerationBatch.step` feeds one token per row against the cache. Each row
keeps its own sampler (own RNG) and detokenizer, so its tokens do not depend on its neighbours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from service.engine.attention import stack_rows, to_json
from service.engine.kv import KVCache, kv_names
from service.engine.metrics import Metrics
from service.engine.sampling import Sampler, SamplingParams, log_softmax
from service.engine.scheduler import Emit, Sequence
from service.engine.streaming import TextStream
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


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: str  # eos | stop | length
    prompt_tokens: int
    completion_tokens: int
    seed: int
    tokens: list[TokenEvent]
    attention: dict[str, Any] | None = None


class GenerationSequence(Sequence):
    def __init__(self, prompt_ids: list[int], params: GenerationParams) -> None:
        super().__init__(rows=1, prefill_tokens=len(prompt_ids))
        self.prompt_ids = prompt_ids
        self.params = params


class _Row:
    """Worker-side state of one sequence."""

    def __init__(self, seq: GenerationSequence, model: GenerationModel) -> None:
        self.seq = seq
        self.params = seq.params
        self.sampler = Sampler(seq.params.sampling, model.vocab_size, seq.prompt_ids)
        self.text = TextStream(model.tokenizer, seq.params.stop)
        self.pieces: list[str] = []
        self.tokens: list[TokenEvent] = []
        self.attention: list[list[np.ndarray]] = []  # per layer: query-row blocks [H, q, k]
        self.last_token_at: float | None = None
        self.first_token_at: float | None = None
        self.finished = False


class GenerationModel:
    def __init__(
        self, name: str, artifact: Artifact, session: GraphSession, tokenizer: Tokenizer, metrics: Metrics
    ) -> None:
        self.name = name
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
        self.vocab_size = artifact.vocab_size
        self.eos = artifact.special_tokens["eos"]
        self.pad = artifact.special_tokens["pad"]
        self.special_ids = set(artifact.special_tokens.values())
        self.n_layers = artifact.n_decoder_layers
        self.present = kv_names("present", self.n_layers)
        names = [f"attentions.{i}" for i in range(self.n_layers)]
        self.attention_names = names if all(session.has_output(n) for n in names) else []

    def run(
        self, input_ids: np.ndarray, cache: KVCache, new_mask: np.ndarray, attention: bool
    ) -> tuple[np.ndarray, KVCache, list[np.ndarray]]:
        """One graph call: last-position logits [B, V], the advanced cache, attention maps if asked."""
        wanted = ["logits", *self.present, *(self.attention_names if attention else [])]
        out = self.session.run({"input_ids": input_ids, **cache.feeds(new_mask)}, wanted, keep=self.present)
        attn = [out[n] for n in self.attention_names] if attention else []
        return out["logits"][:, -1], cache.advance(out, new_mask), attn

    def prefill(self, sequences: list[Sequence]) -> tuple[list[Emit], GenerationBatch | None]:
        rows = [_Row(seq, self) for seq in sequences if isinstance(seq, GenerationSequence)]
        B, S = len(rows), max(len(r.seq.prompt_ids) for r in rows)
        ids = np.full((B, S), self.pad, dtype=np.int64)
        mask = np.zeros((B, S), dtype=np.int64)
        for b, row in enumerate(rows):  # left padding: every prompt ends in the last column
            n = len(row.seq.prompt_ids)
            ids[b, S - n :] = row.seq.prompt_ids
            mask[b, S - n :] = 1
        empty = KVCache.empty(B, self.n_layers, self.artifact.n_heads, self.artifact.d_head)
        want = any(r.params.return_attention for r in rows)
        logits, cache, attn = self.run(ids, empty, mask, want)
        for b, row in enumerate(rows):
            if row.params.return_attention:
                n = len(row.seq.prompt_ids)
                row.attention = [[a[b, :, S - n :, S - n :]] for a in attn]  # [H, n, n]
        batch = GenerationBatch(self, rows, cache, np.zeros((B, 1), dtype=np.int64))
        emits = batch.select(logits)
        return emits, batch.drop_finished()

    def result(self, row: _Row, reason: str) -> GenerationResult:
        self._record_finish(row, reason)
        attention = None
        if row.params.return_attention and row.attention:
            fed = row.seq.prompt_ids + [t.id for t in row.tokens[:-1]]  # the last token was never fed
            layers = [stack_rows(blocks, len(fed)) for blocks in row.attention]
            attention = {"tokens": [self.tokenizer.id_to_token(t) for t in fed], "layers": [to_json(a) for a in layers]}
        return GenerationResult(
            text="".join(row.pieces),
            finish_reason=reason,
            prompt_tokens=len(row.seq.prompt_ids),
            completion_tokens=len(row.tokens),
            seed=row.sampler.seed,
            tokens=row.tokens,
            attention=attention,
        )

    def _record_finish(self, row: _Row, reason: str) -> None:
        self.prompt_tokens.inc(len(row.seq.prompt_ids))
        self.finished.labels(self.name, reason).inc()
        if row.first_token_at is not None:
            if row.seq.admitted is not None:
                self.prefill_time.observe(row.first_token_at - row.seq.admitted)
            self.decode_time.observe(time.perf_counter() - row.first_token_at)

    def top_logprobs(self, logprobs: np.ndarray, k: int) -> list[TopLogprob]:
        top = np.argsort(-logprobs, kind="stable")[:k]
        return [TopLogprob(int(t), self.tokenizer.decode([int(t)]), float(logprobs[t])) for t in top]


class GenerationBatch:
    def __init__(self, model: GenerationModel, items: list[_Row], cache: KVCache, next_ids: np.ndarray) -> None:
        self.model = model
        self.items = items
        self.cache = cache
        self.next_ids = next_ids  # [B, 1]: the token each row feeds next

    @property
    def sequences(self) -> list[Sequence]:
        return [r.seq for r in self.items]

    @property
    def rows(self) -> int:
        return len(self.items)

    def step(self) -> list[Emit]:
        new_mask = np.ones((self.rows, 1), dtype=np.int64)
        want = any(r.params.return_attention for r in self.items)
        logits, self.cache, attn = self.model.run(self.next_ids, self.cache, new_mask, want)
        for b, row in enumerate(self.items):
            if row.params.return_attention:
                keys = self.cache.mask[b].astype(bool)  # drop left padding
                for layer, a in enumerate(attn):
                    row.attention[layer].append(a[b][:, :, keys])  # [H, 1, k]
        emits = self.select(logits)
        self.drop_finished()
        return emits

    def select(self, logits: np.ndarray) -> list[Emit]:
        """Pick each row's next token from [B, V] logits; emit it, and the result if the row is done."""
        m = self.model
        emits: list[Emit] = []
        now = time.perf_counter()
        for b, row in enumerate(self.items):
            p = row.params
            token = row.sampler.select(logits[b])
            row.sampler.observe(token)
            logprob, top = None, None
            if p.logprobs is not None:
                lp = log_softmax(logits[b])
                logprob = float(lp[token])
                top = m.top_logprobs(lp, p.logprobs) if p.logprobs > 0 else None
            piece = row.text.push(token)
            reason = None
            if token == m.eos and not p.ignore_eos:
                reason = "eos"
            elif row.text.stopped:
                reason = "stop"
            elif len(row.tokens) + 1 >= p.max_new_tokens:
                reason = "length"
            if reason is not None:
                piece += row.text.finish()
            event = TokenEvent(len(row.tokens), token, piece, token in m.special_ids, logprob, top)
            row.tokens.append(event)
            row.pieces.append(piece)
            self.next_ids[b, 0] = token
            self._observe(row, now)
            emits.append(Emit(row.seq, event))
            if reason is not None:
                row.finished = True
                emits.append(Emit(row.seq, m.result(row, reason), final=True))
        return emits

    def _observe(self, row: _Row, now: float) -> None:
        m = self.model
        if row.last_token_at is None:
            m.ttft.observe(now - row.seq.enqueued)
            row.first_token_at = now
        else:
            m.itl.observe(now - row.last_token_at)
        row.last_token_at = now
        m.tokens.inc()

    def _take(self, keep: list[int]) -> GenerationBatch | None:
        if not keep:
            return None
        rows = np.asarray(keep, dtype=np.int64)
        return GenerationBatch(self.model, [self.items[i] for i in keep], self.cache.take(rows), self.next_ids[rows])

    def drop_finished(self) -> GenerationBatch | None:
        keep = [i for i, r in enumerate(self.items) if not r.finished]
        if len(keep) < self.rows:
            taken = self._take(keep)
            if taken is None:
                self.items = []
                return None
            self.items, self.cache, self.next_ids = taken.items, taken.cache, taken.next_ids
        return self

    def filter(self, keep: list[Sequence]) -> GenerationBatch | None:
        wanted = {id(s) for s in keep}
        return self._take([i for i, r in enumerate(self.items) if id(r.seq) in wanted])

    def concatenate(self, other: Any) -> GenerationBatch:
        assert isinstance(other, GenerationBatch)
        return GenerationBatch(
            self.model,
            self.items + other.items,
            KVCache.concat([self.cache, other.cache]),
            np.concatenate([self.next_ids, other.next_ids]),
        )
