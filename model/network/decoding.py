"""Reference decoding in PyTorch: greedy and beam search for the translator, sampling for the generator.

These are the ground truth the ONNX graphs and the server are checked against,
so they favour clarity over speed. All of them use the KV cache; the
``*_uncached`` variants recompute the prefix at every step (for tests and the
cached-vs-recompute benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.network.generator import Generator
from model.network.layers import KeyValue, positions_from_mask
from model.network.translator import Translator


def _record(outputs: list[list[int]], done: Tensor, tokens: Tensor, eos: int) -> None:
    """Append each unfinished row's new token (not eos) and mark rows that just emitted eos."""
    for b, token in enumerate(tokens[:, 0].tolist()):
        if not done[b] and token != eos:
            outputs[b].append(token)
    done |= tokens[:, 0] == eos


@torch.no_grad()
def translate_greedy(model: Translator, src_ids: Tensor, src_mask: Tensor, max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of a right-padded source batch; returns target ids without bos/eos."""
    c = model.config
    bos, eos = c.special_tokens["bos"], c.special_tokens["eos"]
    memory, _ = model.encode(src_ids, src_mask)
    cross = model.cross_kv(memory)
    B = src_ids.shape[0]
    tokens = torch.full((B, 1), bos, dtype=torch.long)
    past: list[KeyValue] | None = None
    outputs: list[list[int]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool)
    for step in range(max_new_tokens):
        mask = torch.ones(B, step + 1, dtype=torch.long)
        positions = torch.full((B, 1), step, dtype=torch.long)
        logits, past, _, _ = model.decode(tokens, mask, positions, src_mask, cross, past)
        tokens = logits[:, -1].argmax(-1, keepdim=True)
        _record(outputs, done, tokens, eos)
        if done.all():
            break
    return outputs


@torch.no_grad()
def translate_greedy_uncached(model: Translator, src_ids: Tensor, src_mask: Tensor,
                              max_new_tokens: int) -> list[list[int]]:
    """Same as ``translate_greedy`` but re-runs the whole target prefix at every step (no cache)."""
    c = model.config
    bos, eos = c.special_tokens["bos"], c.special_tokens["eos"]
    B = src_ids.shape[0]
    target = torch.full((B, 1), bos, dtype=torch.long)
    outputs: list[list[int]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(src_ids, src_mask, target, torch.ones_like(target))
        tokens = logits[:, -1].argmax(-1, keepdim=True)
        target = torch.cat([target, tokens], dim=1)
        _record(outputs, done, tokens, eos)
        if done.all():
            break
    return outputs


@dataclass
class Hypothesis:
    tokens: list[int]  # without the end token
    log_prob: float
    score: float  # log_prob / length ** length_penalty, the length counting the end token if there is one


class _Finished:
    """The ``num_beams`` best finished hypotheses of one search, best first."""

    def __init__(self, num_beams: int, length_penalty: float) -> None:
        self.num_beams, self.length_penalty = num_beams, length_penalty
        self.hypotheses: list[Hypothesis] = []

    def add(self, tokens: list[int], log_prob: float, length: int) -> None:
        self.hypotheses.append(Hypothesis(tokens, log_prob, log_prob / max(length, 1) ** self.length_penalty))
        self.hypotheses.sort(key=lambda h: -h.score)
        del self.hypotheses[self.num_beams :]

    def cannot_improve(self, best_live: float, length: int) -> bool:
        """Full, and the best live hypothesis scored at its current length does not beat the worst kept."""
        full = len(self.hypotheses) >= self.num_beams
        return full and self.hypotheses[-1].score >= best_live / length**self.length_penalty


@torch.no_grad()
def _survivors(beams: list[list[int]], beam_scores: Tensor, log_probs: Tensor, eos: int, finished: _Finished,
               length: int) -> tuple[list[list[int]], list[float], list[int], list[int]]:
    """The num_beams best continuations among the 2 * num_beams best candidates (beams, scores, tokens, the row
    each came from); an end token ranked within the top num_beams finishes its hypothesis instead."""
    num_beams = finished.num_beams
    candidates = (beam_scores[:, None] + log_probs).view(-1)
    top_scores, top_ids = _ranked(candidates, min(2 * num_beams, candidates.numel()))
    next_beams, next_scores, next_tokens, sources = [], [], [], []
    for rank, (score, flat_id) in enumerate(zip(top_scores.tolist(), top_ids.tolist(), strict=False)):
        if score == float("-inf"):
            break
        source, token = divmod(flat_id, log_probs.shape[1])
        if token == eos:
            if rank < num_beams:
                finished.add(beams[source], score, length)
            continue
        next_beams.append(beams[source] + [token])
        next_scores.append(score)
        next_tokens.append(token)
        sources.append(source)
        if len(next_beams) == num_beams:
            break
    return next_beams, next_scores, next_tokens, sources


def beam_search(
    model: Translator,
    src_ids: Tensor,
    src_mask: Tensor,
    num_beams: int = 4,
    max_new_tokens: int = 128,
    length_penalty: float = 1.0,
    no_repeat_ngram: int = 0,
    n_best: int = 1,
) -> list[Hypothesis]:
    """Beam search for ONE source sentence (src_ids [1, S]); beams are batch rows.

    The server's rule (``service/engine/tasks/translation/beam_search.py`` states it; a test checks both agree):
    candidates are the live beams' summed float32 log-softmax plus each token's, n-gram repeats at
    -inf; of the 2 * num_beams best, an end token ranked within the top num_beams finishes its
    hypothesis (score = log_prob / length ** length_penalty, the end token counted), a lower-ranked
    one is dropped, and the num_beams best others live on. The search stops when num_beams finished
    hypotheses are kept and the best live one, scored at its current length, does not beat the worst of
    them; at max_new_tokens (live beams then join the finished); or when no candidate is left (then,
    if nothing finished, the live beams are the answer). Returns the ``n_best`` best, best first.
    """
    c = model.config
    bos, eos = c.special_tokens["bos"], c.special_tokens["eos"]
    memory, _ = model.encode(src_ids, src_mask)
    cross = [(k.expand(num_beams, -1, -1, -1), v.expand(num_beams, -1, -1, -1)) for k, v in model.cross_kv(memory)]
    beam_src_mask = src_mask.expand(num_beams, -1)
    beams: list[list[int]] = [[]]  # all beams start identical: one row at the first step
    beam_scores = torch.zeros(1)
    tokens = torch.full((num_beams, 1), bos, dtype=torch.long)
    past: list[KeyValue] | None = None
    finished = _Finished(num_beams, length_penalty)
    for step in range(max_new_tokens):
        rows, length = len(beams), step + 1
        mask = torch.ones(rows, length, dtype=torch.long)
        positions = torch.full((rows, 1), step, dtype=torch.long)
        src = beam_src_mask[:rows]
        row_cross = [(k[:rows], v[:rows]) for k, v in cross]
        logits, past, _, _ = model.decode(tokens[:rows], mask, positions, src, row_cross, past)
        log_probs = logits[:, -1].float().log_softmax(-1)  # [rows, V]
        for b in range(rows) if no_repeat_ngram else ():
            for banned in banned_tokens(beams[b], no_repeat_ngram):
                log_probs[b, banned] = float("-inf")
        next_beams, next_scores, next_tokens, sources = _survivors(beams, beam_scores, log_probs, eos, finished, length)
        if length >= max_new_tokens:
            for beam, score in zip(next_beams, next_scores, strict=False):
                finished.add(beam, score, length)
            break
        if not next_beams:
            if not finished.hypotheses:
                for beam, score in zip(beams, beam_scores.tolist(), strict=False):
                    finished.add(beam, score, len(beam))
            break
        if finished.cannot_improve(max(next_scores), length):
            break
        index = torch.tensor(sources)
        past = [(k[index], v[index]) for k, v in past]
        beams, beam_scores = next_beams, torch.tensor(next_scores)
        tokens = torch.tensor(next_tokens)[:, None]
    return finished.hypotheses[:n_best]


def _ranked(candidates: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best candidates, best first; equal scores by lower flat index (as the server ranks them)."""
    scores, ids = candidates.topk(k)
    order = sorted(range(k), key=lambda i: (-scores[i].item(), ids[i].item()))
    return scores[order], ids[order]


def banned_tokens(tokens: list[int], n: int) -> list[int]:
    """Tokens that would repeat an n-gram already present in ``tokens``."""
    if len(tokens) < n - 1 or n <= 0:
        return []
    prefix = tuple(tokens[len(tokens) - n + 1 :]) if n > 1 else ()
    return [tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n - 1]) == prefix]


def filter_logits(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Temperature, then top-k, then nucleus (top-p) filtering of [B, V] logits."""
    logits = logits / max(temperature, 1e-6)
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return logits


@torch.no_grad()
def generate(model: Generator, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Left-padded prompts [B, S] -> new tokens [B, max_new_tokens]; temperature 0 = greedy."""
    past: list[KeyValue] | None = None
    tokens, mask, new = input_ids, attention_mask, []
    for _ in range(max_new_tokens):
        positions = positions_from_mask(mask, tokens.shape[1])
        logits, past, _ = model(tokens, mask, positions, past)
        last = logits[:, -1]
        if temperature == 0.0:
            tokens = last.argmax(-1, keepdim=True)
        else:
            probs = filter_logits(last, temperature, top_k, top_p).softmax(-1)
            tokens = torch.multinomial(probs, 1, generator=generator)
        new.append(tokens)
        mask = torch.cat([mask, torch.ones_like(tokens)], dim=1)
    return torch.cat(new, dim=1)


@torch.no_grad()
def generate_uncached(model: Generator, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> Tensor:
    """Greedy generation that recomputes the whole sequence at every step."""
    tokens, mask = input_ids, attention_mask
    for _ in range(max_new_tokens):
        positions = positions_from_mask(mask, tokens.shape[1])
        logits, _, _ = model(tokens, mask, positions)
        next_tokens = logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_tokens], dim=1)
        mask = torch.cat([mask, torch.ones_like(next_tokens)], dim=1)
    return tokens[:, input_ids.shape[1] :]
