"""Encoder-decoder translation: batched greedy decoding and beam search (beams are batch rows), with a
KV cache and continuous batching.

`prefill` runs the encoder once for all newcomers (their cross-attention K/V is computed once per source
and reused at every step); each `step` feeds one token per row. A request's beams are contiguous rows;
after each step the rows are re-gathered so each new beam continues its parent's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from service.engine.attention import stack_rows, to_json
from service.engine.kv import CrossState, KVCache, kv_names
from service.engine.metrics import Metrics
from service.engine.sampling import Sampler, SamplingParams, log_softmax
from service.engine.scheduler import Emit, Sequence
from service.engine.streaming import TextStream
from service.runtime.artifact import Artifact
from service.runtime.sessions import GraphSession


@dataclass(frozen=True)
class TranslationParams:
    num_beams: int = 4
    n_best: int = 1
    length_penalty: float = 1.0  # score = sum(logprob) / length ** length_penalty
    max_new_tokens: int | None = None  # None: 2 * source length + 16, within the server cap
    no_repeat_ngram_size: int = 3  # the model card measures beam 4 with this ban (README "Models")
    sampling: SamplingParams | None = None  # None: deterministic (greedy or beam search)
    return_attention: bool = False
    stream: bool = False  # emit a TranslationPiece per token (num_beams=1 only: beams change their past)


@dataclass(frozen=True)
class Hypothesis:
    text: str
    score: float
    logprob: float
    token_ids: list[int]


@dataclass(frozen=True)
class TranslationPiece:
    """One streamed target token and the text it completes ("" while a character is incomplete)."""

    index: int
    id: int
    text: str


@dataclass(frozen=True)
class TranslationResult:
    hypotheses: list[Hypothesis]  # best first, n_best of them
    input_tokens: int
    attention: dict[str, Any] | None = None


class TranslationSequence(Sequence):
    def __init__(self, src_ids: list[int], params: TranslationParams, max_new_tokens: int) -> None:
        super().__init__(rows=params.num_beams, prefill_tokens=len(src_ids))
        self.src_ids = src_ids
        self.params = params
        self.max_new_tokens = max_new_tokens


@dataclass
class _Hyp:
    """One beam: the tokens after bos, their summed logprob, and (if asked) its attention rows."""

    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    self_attn: list[list[np.ndarray]] = field(default_factory=list)  # per layer: [H, 1, k] per step
    cross_attn: list[list[np.ndarray]] = field(default_factory=list)  # per layer: [H, 1, Ssrc] per step

    def extend(self, token: int, logprob: float) -> _Hyp:
        return _Hyp(
            [*self.tokens, token],
            self.logprob + logprob,
            [list(rows) for rows in self.self_attn],
            [list(rows) for rows in self.cross_attn],
        )


def banned_ngram_tokens(tokens: list[int], n: int) -> list[int]:
    """Tokens that would repeat an n-gram already in `tokens`."""
    if n <= 0 or len(tokens) < n:
        return []
    prefix = tuple(tokens[len(tokens) - n + 1 :])
    return [tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n - 1]) == prefix]


class _Beams:
    """Worker-side search state of one request."""

    def __init__(self, seq: TranslationSequence, model: TranslationModel) -> None:
        self.seq = seq
        self.params = seq.params
        self.eos = model.eos
        self.sampler = Sampler(seq.params.sampling, model.vocab_size) if seq.params.sampling else None
        self.finished: list[tuple[float, _Hyp]] = []  # (score, hypothesis), best first
        self.encoder_attention: list[np.ndarray] = []
        self.done = False
        self.text = TextStream(model.tokenizer) if seq.params.stream else None
        self.streamed = 0  # tokens of the (single) hypothesis already emitted

    def pieces(self, children: list[tuple[int, _Hyp]]) -> list[TranslationPiece]:
        """Stream the greedy hypothesis: its tokens not yet emitted, with the text they complete."""
        if self.text is None:
            return []
        hyp = children[0][1] if children else self.finished[0][1]
        pieces = []
        for token in hyp.tokens[self.streamed :]:
            pieces.append(TranslationPiece(self.streamed, token, self.text.push(token)))
            self.streamed += 1
        if self.done and pieces:
            last = pieces[-1]
            pieces[-1] = TranslationPiece(last.index, last.id, last.text + self.text.finish())
        return pieces

    def score(self, hyp: _Hyp) -> float:
        return float(hyp.logprob / (len(hyp.tokens) ** self.params.length_penalty))

    def add_finished(self, hyp: _Hyp) -> None:
        self.finished.append((self.score(hyp), hyp))
        self.finished.sort(key=lambda item: -item[0])
        del self.finished[self.params.num_beams :]

    def advance(self, hyps: list[_Hyp], logits: np.ndarray, logp: np.ndarray) -> list[tuple[int, _Hyp]]:
        """Choose the next beams from this request's rows; return (parent row, child) pairs.
        An empty list means the request is done."""
        for r, hyp in enumerate(hyps):
            banned = banned_ngram_tokens(hyp.tokens, self.params.no_repeat_ngram_size)
            logits[r, banned] = -np.inf
            logp[r, banned] = -np.inf
        length = len(hyps[0].tokens) + 1
        children = self._greedy(hyps, logits, logp) if self.params.num_beams == 1 else self._beam(hyps, logp)
        if length >= self.seq.max_new_tokens:
            for _, child in children:
                self.add_finished(child)
            children = []
        elif self.params.num_beams > 1 and children and len(self.finished) >= self.params.num_beams:
            # Done once no running beam can beat the worst kept hypothesis (the usual heuristic).
            best_running = max(c.logprob for _, c in children) / length**self.params.length_penalty
            if self.finished[-1][0] >= best_running:
                children = []
        if not children and not self.finished:  # every candidate was banned: return what there is
            for hyp in hyps:
                self.add_finished(hyp)
        self.done = not children
        return children

    def _greedy(self, hyps: list[_Hyp], logits: np.ndarray, logp: np.ndarray) -> list[tuple[int, _Hyp]]:
        token = self.sampler.select(logits[0]) if self.sampler else int(np.argmax(logp[0]))
        child = hyps[0].extend(token, float(logp[0, token]))
        if token == self.eos:
            self.add_finished(child)
            return []
        return [(0, child)]

    def _beam(self, hyps: list[_Hyp], logp: np.ndarray) -> list[tuple[int, _Hyp]]:
        nb = self.params.num_beams
        scores = np.array([h.logprob for h in hyps])[:, None] + logp  # [rows, V]
        flat = scores.ravel()
        k = min(2 * nb, flat.size)
        top = np.argpartition(-flat, k - 1)[:k]
        top = top[np.lexsort((top, -flat[top]))]  # best first, ties by index: deterministic
        children: list[tuple[int, _Hyp]] = []
        for rank, index in enumerate(top):
            if not np.isfinite(flat[index]):
                break
            row, token = divmod(int(index), logp.shape[1])
            child = hyps[row].extend(token, float(logp[row, token]))
            if token == self.eos:
                if rank < nb:
                    self.add_finished(child)
                continue
            children.append((row, child))
            if len(children) == nb:
                break
        return children


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
        self.artifact = artifact
        self.encoder = encoder
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.vocab_size = artifact.vocab_size
        self.pad, self.bos, self.eos = (artifact.special_tokens[k] for k in ("pad", "bos", "eos"))
        n_dec, n_enc = artifact.n_decoder_layers, artifact.dims["n_encoder_layers"]
        self.n_layers = n_dec
        self.cross = kv_names("cross", n_dec)
        self.present = kv_names("present", n_dec)
        enc_attn = [f"attentions.{i}" for i in range(n_enc)]
        dec_attn = [f"attentions.{i}" for i in range(n_dec)] + [f"cross_attentions.{i}" for i in range(n_dec)]
        has_attention = all(encoder.has_output(n) for n in enc_attn) and all(decoder.has_output(n) for n in dec_attn)
        self.encoder_attention = enc_attn if has_attention else []
        self.decoder_attention = dec_attn if has_attention else []

    def place(self, cross: CrossState) -> CrossState:
        """Cross K/V is fed at every step: keep it on the decoder's device (a no-op on CPU)."""
        return CrossState(cross.mask, [self.decoder.place(t) for t in cross.kv])

    def prefill(self, sequences: list[Sequence]) -> tuple[list[Emit], TranslationBatch | None]:
        beams = [_Beams(seq, self) for seq in sequences if isinstance(seq, TranslationSequence)]
        B, S = len(beams), max(len(b.seq.src_ids) for b in beams)
        ids = np.full((B, S), self.pad, dtype=np.int64)
        mask = np.zeros((B, S), dtype=np.int64)
        for i, b in enumerate(beams):  # right padding, as the encoder was trained
            n = len(b.seq.src_ids)
            ids[i, :n] = b.seq.src_ids
            mask[i, :n] = 1
        want = any(b.params.return_attention for b in beams)
        wanted = self.cross + (self.encoder_attention if want else [])
        out = self.encoder.run({"input_ids": ids, "attention_mask": mask}, wanted, keep=self.cross)
        hyps = []
        for i, b in enumerate(beams):
            hyp = _Hyp()
            if b.params.return_attention:
                n = len(b.seq.src_ids)
                b.encoder_attention = [out[name][i, :, :n, :n] for name in self.encoder_attention]
                hyp = _Hyp(self_attn=[[] for _ in range(self.n_layers)], cross_attn=[[] for _ in range(self.n_layers)])
            hyps.append(hyp)
        cross = CrossState(mask, [out[name] for name in self.cross])
        cache = KVCache.empty(B, self.n_layers, self.artifact.n_heads, self.artifact.d_head)
        next_ids = np.full((B, 1), self.bos, dtype=np.int64)
        return [], TranslationBatch(self, beams, hyps, [1] * B, cache, cross, next_ids)

    def result(self, beams: _Beams) -> TranslationResult:
        best = beams.finished[: beams.params.n_best]
        hypotheses = [
            Hypothesis(self.tokenizer.decode(h.tokens, skip_special_tokens=True), float(s), h.logprob, h.tokens)
            for s, h in best
        ]
        attention = self.attention(beams, best[0][1]) if beams.params.return_attention and best else None
        return TranslationResult(hypotheses, len(beams.seq.src_ids), attention)

    def attention(self, beams: _Beams, hyp: _Hyp) -> dict[str, Any]:
        def names(ids: list[int]) -> list[str | None]:
            return [self.tokenizer.id_to_token(t) for t in ids]

        steps = len(hyp.tokens)
        return {
            "source_tokens": names(beams.seq.src_ids),
            "target_tokens": names(hyp.tokens),
            "decoder_input_tokens": names([self.bos, *hyp.tokens[:-1]]),
            "encoder": [to_json(a) for a in beams.encoder_attention],
            "decoder": [to_json(stack_rows(rows, steps)) for rows in hyp.self_attn],
            "cross": [to_json(np.concatenate(rows, axis=1)) for rows in hyp.cross_attn],
        }


class TranslationBatch:
    def __init__(
        self,
        model: TranslationModel,
        beams: list[_Beams],
        hyps: list[_Hyp],
        counts: list[int],
        cache: KVCache,
        cross: CrossState,
        next_ids: np.ndarray,
    ) -> None:
        self.model = model
        self.beams = beams  # one per request
        self.hyps = hyps  # one per row; a request's rows are contiguous
        self.counts = counts  # rows per request
        self.cache = cache
        self.cross = cross
        self.next_ids = next_ids  # [R, 1]

    @property
    def sequences(self) -> list[Sequence]:
        return [b.seq for b in self.beams]

    @property
    def rows(self) -> int:
        return len(self.hyps)

    def step(self) -> list[Emit]:
        m = self.model
        R = self.rows
        new_mask = np.ones((R, 1), dtype=np.int64)
        want = any(b.params.return_attention for b in self.beams)
        wanted = ["logits", *m.present, *(m.decoder_attention if want else [])]
        feeds = {"input_ids": self.next_ids, **self.cache.feeds(new_mask), **self.cross.feeds()}
        out = m.decoder.run(feeds, wanted, keep=m.present)
        cache = self.cache.advance(out, new_mask)
        logits = np.array(out["logits"][:, -1], dtype=np.float64)
        logp = log_softmax(logits)
        if want:
            self._record_attention(out, cache)
        m.metrics.generated_tokens.labels(m.name).inc(R)

        emits: list[Emit] = []
        parents: list[int] = []
        beams, hyps, counts = [], [], []
        start = 0
        for b, count in zip(self.beams, self.counts, strict=True):
            rows = slice(start, start + count)
            children = b.advance(self.hyps[rows], logits[rows], logp[rows])
            emits += [Emit(b.seq, piece) for piece in b.pieces(children)]
            if b.done:
                emits.append(Emit(b.seq, m.result(b), final=True))
            else:
                beams.append(b)
                counts.append(len(children))
                parents += [start + row for row, _ in children]
                hyps += [child for _, child in children]
            start += count
        index = np.asarray(parents, dtype=np.int64)
        # Every beam of a request reads the same source: re-gather the cross K/V only when the rows per
        # request change, not when beams merely reorder.
        same_rows = len(beams) == len(self.beams) and counts == self.counts
        self.cross = self.cross if same_rows else m.place(self.cross.take(index))
        self.cache = cache.take(index)
        self.beams, self.hyps, self.counts = beams, hyps, counts
        self.next_ids = np.array([[h.tokens[-1]] for h in hyps], dtype=np.int64).reshape(-1, 1)
        return emits

    def _record_attention(self, out: dict[str, Any], cache: KVCache) -> None:
        n = self.model.n_layers
        self_maps, cross_maps = self.model.decoder_attention[:n], self.model.decoder_attention[n:]
        for row, hyp in enumerate(self.hyps):
            if not hyp.self_attn:
                continue
            keys = cache.mask[row].astype(bool)  # drop left padding
            src = int(self.cross.mask[row].sum())  # drop right padding
            for layer in range(n):
                hyp.self_attn[layer].append(out[self_maps[layer]][row][:, :, keys])
                hyp.cross_attn[layer].append(out[cross_maps[layer]][row][:, :, :src])

    def _rows_of(self, keep: set[int]) -> tuple[list[int], np.ndarray]:
        requests: list[int] = []
        rows: list[int] = []
        start = 0
        for i, (b, count) in enumerate(zip(self.beams, self.counts, strict=True)):
            if id(b.seq) in keep:
                requests.append(i)
                rows += range(start, start + count)
            start += count
        return requests, np.asarray(rows, dtype=np.int64)

    def filter(self, keep: list[Sequence]) -> TranslationBatch | None:
        requests, rows = self._rows_of({id(s) for s in keep})
        if not requests:
            return None
        return TranslationBatch(
            self.model,
            [self.beams[i] for i in requests],
            [self.hyps[r] for r in rows],
            [self.counts[i] for i in requests],
            self.cache.take(rows),
            self.model.place(self.cross.take(rows)),
            self.next_ids[rows],
        )

    def concatenate(self, other: Any) -> TranslationBatch:
        assert isinstance(other, TranslationBatch)
        return TranslationBatch(
            self.model,
            self.beams + other.beams,
            self.hyps + other.hyps,
            self.counts + other.counts,
            KVCache.concat([self.cache, other.cache]),
            self.model.place(CrossState.concat([self.cross, other.cross])),
            np.concatenate([self.next_ids, other.next_ids]),
        )
