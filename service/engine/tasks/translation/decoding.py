"""Encoder-decoder translation: greedy or sampled decoding and beam search in one batch (beams are rows),
with a KV cache and continuous batching.

`prefill` runs the encoder once for all newcomers (their cross-attention K/V is computed once per source
and reused at every step); each `step` feeds one token per row. A request's rows are contiguous, in
request order. Rows of num_beams=1 requests choose through the batch-wide chooser (penalties, logit bias,
sampling) and stop through `stopping`; beam rows go through `beam_search`, which decides each request's
rows for the next step; the cache is re-gathered only where a row's parent changed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from contract.names import ATTENTION_MASK, CROSS, LOGITS, PRESENT, TOP_IDS, TOP_K, TOP_LOGPROBS
from service.engine.attention import RowAttention
from service.engine.cache.appended import CrossState, KVCache, kv_names
from service.engine.encoder_batch import encoder_feeds
from service.engine.metrics import Metrics
from service.engine.sequence import Emit, Sequence
from service.engine.tasks.translation.attention_maps import AttentionOutputs, attention_json
from service.engine.tasks.translation.beam_search import (
    BeamPool,
    Candidates,
    Targets,
    banned_ngrams,
    beam_step,
)
from service.engine.tasks.translation.request import (
    GREEDY,
    Hypothesis,
    TranslationParams,
    TranslationPiece,
    TranslationResult,
    TranslationSequence,
)
from service.engine.tasks.translation.step import StepOutput, beam_width, forced_logits
from service.engine.tokens.batch import SequenceBatch
from service.engine.tokens.chooser import ChooserRows, choose
from service.engine.tokens.stopping import END, LENGTH, RUNNING, StopRows, release
from service.engine.tokens.streaming import TextStream
from service.runtime.artifact import Artifact
from service.runtime.scoring_head import TopLogprobs
from service.runtime.sessions import GraphSession

__all__ = [
    "GREEDY",
    "Hypothesis",
    "TranslationBatch",
    "TranslationModel",
    "TranslationParams",
    "TranslationPiece",
    "TranslationResult",
    "TranslationSequence",
]


@dataclass
class _Request:
    """Worker-side state of one sequence: its finished hypotheses and, for num_beams=1, its text."""

    seq: TranslationSequence
    pool: BeamPool
    text: TextStream | None = None  # streamed or stop strings
    tail: str = ""
    encoder_attention: list[np.ndarray] = field(default_factory=list)
    last_token_at: float | None = None

    @property
    def beams(self) -> bool:
        return self.seq.params.num_beams > 1


class TranslationModel:
    def __init__(
        self,
        name: str,
        artifact: Artifact,
        encoder: GraphSession,
        decoder: GraphSession,
        tokenizer: Tokenizer,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.top_logprobs = TopLogprobs()  # beam search's scoring head, for graphs without their own
        # The decoder's own scoring head (exports since it was added): beam steps fetch [rows, k], not logits.
        self.head_in_graph = decoder.spec.ranks_top_k and all(map(decoder.has_output, (TOP_LOGPROBS, TOP_IDS)))
        self.artifact = artifact
        self.encoder = encoder
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.vocab_size = artifact.vocab_size
        self.pad, self.bos, self.eos = (artifact.special_tokens[k] for k in ("pad", "bos", "eos"))
        n_dec = self.n_layers = artifact.n_decoder_layers
        self.cross = kv_names(CROSS, n_dec)
        self.present = kv_names(PRESENT, n_dec)
        self.attention_outputs = AttentionOutputs(encoder, decoder, artifact.dims["n_encoder_layers"], n_dec)
        self.ttft = metrics.time_to_first_token.labels(name)
        self.itl = metrics.inter_token_latency.labels(name)
        self.tokens = metrics.generated_tokens.labels(name)

    @property
    def encoder_attention(self) -> list[str]:
        """The encoder's attention outputs (empty where the graphs lack them: no maps are served)."""
        return self.attention_outputs.encoder

    @property
    def decoder_attention(self) -> list[str]:
        """The decoder's self-attention outputs, then its cross-attention ones (empty: as above)."""
        return self.attention_outputs.decoder

    def place(self, cross: CrossState) -> CrossState:
        """Cross K/V is fed at every step: keep it on the decoder's device (a no-op on CPU)."""
        return CrossState(cross.mask, [self.decoder.place(t) for t in cross.kv])

    def prefill(self, sequences: list[Sequence]) -> tuple[list[Emit], TranslationBatch | None]:
        requests = [self._request(seq) for seq in sequences if isinstance(seq, TranslationSequence)]
        B = len(requests)
        sources = self._sources(requests)
        out = self.encoder.run(sources, self.cross, keep=self.cross)
        attention: list[RowAttention | None] | None = None
        if any(r.seq.params.return_attention for r in requests):
            self._encoder_maps([r for r in requests if r.seq.params.return_attention])
            attention = [RowAttention.empty(self.n_layers) if r.seq.params.return_attention else None for r in requests]
        greedy = [r for r in requests if not r.beams]
        sampling = [r.seq.params.sampling or GREEDY for r in greedy]
        chooser = ChooserRows.create(sampling, self.vocab_size, (), [0] * len(greedy))
        stops = StopRows.create([r.seq.max_new_tokens for r in greedy], [False] * len(greedy))
        cross = CrossState(sources[ATTENTION_MASK], [out[name] for name in self.cross])
        cache = KVCache.empty(B, self.n_layers, self.artifact.n_kv_heads, self.artifact.d_head)
        targets = Targets.empty(B, self.artifact.max_positions)
        next_ids = np.full((B, 1), self.bos, dtype=np.int64)
        lengths = np.ones(B, np.int64)
        return [], TranslationBatch(self, requests, lengths, targets, chooser, stops, attention, cache, cross, next_ids)

    def _sources(self, requests: list[_Request]) -> dict[str, np.ndarray]:
        """Source ids and mask, right-padded (as the encoder was trained)."""
        return encoder_feeds([r.seq.src_ids for r in requests], None, self.pad)

    def _encoder_maps(self, requests: list[_Request]) -> None:
        """The encoder's maps of the requests that asked, from a run of their own: a run returns maps for
        every row, and the batch's other sources (up to 64, of up to 512 tokens) would make them hundreds of MB."""
        out = self.encoder.run(self._sources(requests), self.attention_outputs.encoder)
        maps = self.attention_outputs.of_sources(out, [len(r.seq.src_ids) for r in requests])
        for r, encoder_maps in zip(requests, maps, strict=True):
            r.encoder_attention = encoder_maps

    def _request(self, seq: TranslationSequence) -> _Request:
        p = seq.params
        text = TextStream(self.tokenizer, p.stop) if p.num_beams == 1 and (p.stream or p.stop) else None
        return _Request(seq, BeamPool(p.num_beams, p.length_penalty, seq.max_new_tokens), text)

    def result(self, req: _Request) -> TranslationResult:
        best = req.pool.finished[: req.seq.params.n_best]
        texts = [self.tokenizer.decode(f.tokens, skip_special_tokens=True) for f in best]
        if req.text is not None:  # the streamed text: stop strings cut it
            texts = [req.text.text]
        hypotheses = [
            Hypothesis(t, float(f.score), float(f.logprob), f.tokens) for t, f in zip(texts, best, strict=True)
        ]
        self.tokens.inc(sum(len(f.tokens) for f in best))
        attention = None
        if req.seq.params.return_attention and best:
            names, heads = self.tokenizer.id_to_token, self.artifact.n_heads
            attention = attention_json(names, self.bos, heads, req.seq.src_ids, best[0], req.encoder_attention)
        return TranslationResult(hypotheses, len(req.seq.src_ids), attention, req.tail)


class TranslationBatch(SequenceBatch[_Request]):
    cache: KVCache  # the translator's decoder appends to its cache (no in-place slots)

    def __init__(
        self,
        model: TranslationModel,
        requests: list[_Request],
        counts: np.ndarray,
        targets: Targets,
        chooser: ChooserRows,
        stops: StopRows,
        attention: list[RowAttention | None] | None,
        cache: KVCache | None,
        cross: CrossState,
        next_ids: np.ndarray,
    ) -> None:
        self.model = model
        self.requests = requests  # a request's rows are contiguous, in this order
        self.counts = counts  # [n] rows per request
        self.targets = targets  # [R]
        self.chooser, self.stops = chooser, stops  # one row per num_beams=1 request, in request order
        self.attention = attention  # [R] when some request asked for attention maps
        assert cache is not None, "a translation batch's rows carry their cache"
        self.cache = cache
        self.cross = cross
        self.next_ids = next_ids  # [R, 1]
        self.beam = np.asarray([r.beams for r in requests], dtype=bool)
        self.texts = np.asarray([r.text is not None for r in requests], dtype=bool)

    @property
    def entries(self) -> list[_Request]:
        return self.requests

    @property
    def rows(self) -> int:
        return len(self.targets)  # a beam search request's beams are rows each

    def step(self) -> list[Emit]:
        m = self.model
        sizes = [r.seq.params.no_repeat_ngram_size for r in self.requests]
        banned = banned_ngrams(self.targets, np.repeat(sizes, self.counts), set(sizes))  # targets only: known now
        offsets = np.cumsum(self.counts) - self.counts
        k = 0
        if self.beam.any():
            widest = max(r.seq.params.num_beams for r, beam in zip(self.requests, self.beam, strict=True) if beam)
            k = beam_width(widest, banned[0][np.repeat(self.beam, self.counts)[banned[0]]], m.vocab_size)
        forced = self._forced()
        # One rule: the head's [rows, k] when beam rows rank candidates and the graph has it; the logits when
        # num_beams=1 rows choose from them (the whole distribution), for the standalone head, and on a first
        # step with forced tokens (the standalone head ranks the forced logits: one rule for ties).
        head = k > 0 and m.head_in_graph and not forced
        logits = not (head and self.beam.all())
        scores = [*([LOGITS] if logits else []), *([TOP_LOGPROBS, TOP_IDS] if head else [])]
        new_mask = np.ones((self.rows, 1), dtype=np.int64)
        feeds = {"input_ids": self.next_ids, **self.cache.feeds(new_mask), **self.cross.feeds()}
        if head:
            feeds[TOP_K] = np.array([k], dtype=np.int64)
        wanted = [*scores, *m.present, *(m.decoder_attention if self.attention is not None else [])]
        out = m.decoder.run(feeds, wanted, keep=m.present)
        cache = self.cache.advance(out, new_mask)
        if self.attention is not None:
            m.attention_outputs.record(self.attention, out, cache.mask, self.cross.mask)
        last = forced_logits(out[LOGITS][:, -1], forced) if logits else None
        top = (out[TOP_LOGPROBS], out[TOP_IDS]) if head else None
        now = StepOutput(last, top, k, banned, offsets, [])
        parts = []
        self._observe(time.perf_counter())
        if not self.beam.all():
            parts.append(self._choose(now, np.flatnonzero(~self.beam)))
        if self.beam.any():
            parts.append(self._search(now, np.flatnonzero(self.beam)))
        request, parents, tokens, logprob = (np.concatenate(column) for column in zip(*parts, strict=True))
        order = np.argsort(request, kind="stable")
        self._advance(cache, request[order], parents[order], tokens[order], logprob[order])
        return now.emits

    def _choose(self, now: StepOutput, requests: np.ndarray) -> tuple[np.ndarray, ...]:
        """The num_beams=1 requests (one row each): the chooser picks, `stopping` ends them."""
        m, rows = self.model, now.offsets[requests]
        bans = self._bans_among(now, rows)
        choice = choose(self.chooser, now.of_rows(rows), bans if len(bans[0]) else None)
        self.chooser.observe(choice.tokens)
        codes = self.stops.update(choice.tokens, m.eos)
        assert choice.logprobs is not None  # every translation row asks: its hypothesis is scored with them
        logprob = self.targets.logprob[rows] + choice.logprobs
        alive = np.ones(len(rows), dtype=bool)
        for j in np.flatnonzero(self.texts[requests] | (codes != RUNNING)).tolist():
            req, token, code, row = self.requests[requests[j]], int(choice.tokens[j]), int(codes[j]), int(rows[j])
            reason = "eos" if code == END else "length" if code == LENGTH else None
            if req.text is not None:
                piece, reason = release(req.text, token, code)
                if code == END:
                    req.tail = piece
                elif req.seq.params.stream:
                    index = int(self.targets.length[row])
                    now.emits.append(Emit(req.seq, TranslationPiece(index, token, piece, float(choice.logprobs[j]))))
            if reason is not None:
                tokens = self.targets.tokens(row) + ([] if code == END else [token])
                req.pool.add(float(logprob[j]), tokens, int(self.targets.length[row]) + 1, self._attention_of(row))
                now.emits.append(Emit(req.seq, m.result(req), final=True))
                alive[j] = False
        return requests[alive], rows[alive], choice.tokens[alive], logprob[alive]

    def _search(self, now: StepOutput, requests: np.ndarray) -> tuple[np.ndarray, ...]:
        """The beam requests: each row's best tokens from a scoring head (enough that 2 * num_beams
        survive the n-gram ban), then `beam_step` for all of them."""
        counts = self.counts[requests]
        rows = np.arange(counts.sum()) + np.repeat(now.offsets[requests] - (np.cumsum(counts) - counts), counts)
        ban_rows, ban_tokens = self._bans_among(now, rows)
        logprob, token = now.candidates(rows, self.model.top_logprobs)
        row, rank = np.nonzero(token[ban_rows] == ban_tokens[:, None])  # the banned among them
        logprob[ban_rows[row], rank] = -np.inf
        targets = self.targets if len(rows) == self.rows else self.targets.take(rows)
        pools = [self.requests[i].pool for i in requests.tolist()]
        candidates = Candidates(logprob, token)
        step = beam_step(candidates, targets, counts, pools, self.model.eos, lambda r: self._attention_of(int(rows[r])))
        for i in requests[step.counts == 0].tolist():
            now.emits.append(Emit(self.requests[i].seq, self.model.result(self.requests[i]), final=True))
        return np.repeat(requests, step.counts), rows[step.parents], step.tokens, step.logprob

    def _bans_among(self, now: StepOutput, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The n-gram bans that fall on ``rows``, as (position among ``rows``, token)."""
        local, (ban_rows, ban_tokens) = self._local(rows), now.banned
        hit = local[ban_rows] >= 0
        return local[ban_rows[hit]], ban_tokens[hit]

    def _forced(self) -> list[tuple[int, int]]:
        """(row, token): at the first step, a request with a forced first token (a target language) can
        choose only it, with logprob 0, as transformers' ForcedBOSTokenLogitsProcessor does."""
        offsets = np.cumsum(self.counts) - self.counts
        return [
            (int(o), r.seq.forced_first)
            for o, r in zip(offsets, self.requests, strict=True)
            if r.seq.forced_first is not None and self.targets.length[o] == 0
        ]

    def _local(self, rows: np.ndarray) -> np.ndarray:
        """Batch row -> its index in `rows` (-1 elsewhere)."""
        local = np.full(self.rows, -1, dtype=np.int64)
        local[rows] = np.arange(len(rows))
        return local

    def _attention_of(self, row: int) -> RowAttention | None:
        return None if self.attention is None else self.attention[row]

    def _observe(self, now: float) -> None:
        m = self.model
        for req in self.requests:
            if req.last_token_at is None:
                m.ttft.observe(now - req.seq.enqueued)
            else:
                m.itl.observe(now - req.last_token_at)
            req.last_token_at = now

    def _advance(
        self, cache: KVCache, request: np.ndarray, parents: np.ndarray, tokens: np.ndarray, logprob: np.ndarray
    ) -> None:
        """Row i of the next step continues row parents[i]; requests without rows are done and leave."""
        counts = np.bincount(request, minlength=len(self.requests))
        keep = np.flatnonzero(counts > 0)
        if not np.array_equal(counts, self.counts):  # every row of a request reads the same source
            self.cross = self.model.place(self.cross.take(parents))
        greedy = np.flatnonzero(~self.beam)
        kept = np.flatnonzero(counts[greedy] > 0)
        if len(kept) < len(greedy):
            self.chooser, self.stops = self.chooser.take(kept), self.stops.take(kept)
        if self.attention is not None:
            rows = [self.attention[p] for p in parents.tolist()]
            self.attention = [None if a is None else a.copy() for a in rows]
        self.targets = self.targets.extended(parents, tokens, logprob)
        self.cache = cache.reorder(parents)
        self.requests, self.counts = [self.requests[i] for i in keep.tolist()], counts[keep]
        self.beam, self.texts = self.beam[keep], self.texts[keep]
        self.next_ids = tokens.astype(np.int64).reshape(-1, 1)

    def _take(self, requests: list[int]) -> TranslationBatch | None:
        if not requests:
            return None
        index = np.asarray(requests, dtype=np.int64)
        offsets = np.cumsum(self.counts) - self.counts
        counts = self.counts[index]
        rows = np.arange(counts.sum()) + np.repeat(offsets[index] - (np.cumsum(counts) - counts), counts)
        greedy = (np.cumsum(~self.beam) - 1)[index[~self.beam[index]]]
        return TranslationBatch(
            self.model,
            [self.requests[i] for i in requests],
            counts,
            self.targets.take(rows),
            attention=None if self.attention is None else [self.attention[r] for r in rows.tolist()],
            cross=self.model.place(self.cross.take(rows)),
            **self._state_of(rows, greedy),
        )

    def concatenate(self, other: Any) -> TranslationBatch:
        assert isinstance(other, TranslationBatch)
        attention = None
        if self.attention is not None or other.attention is not None:
            attention = (self.attention or [None] * self.rows) + (other.attention or [None] * other.rows)
        return TranslationBatch(
            self.model,
            self.requests + other.requests,
            np.concatenate([self.counts, other.counts]),
            Targets.concat([self.targets, other.targets]),
            attention=attention,
            cross=self.model.place(CrossState.concat([self.cross, other.cross])),
            **self._state_with(other),
        )
