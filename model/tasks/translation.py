"""Translator training task (teacher forcing, label smoothing, token-bucketed batches) and evaluation."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor

from model.network.decoding import beam_search, translate_greedy
from model.network.translator import Translator
from model.training.loop import on_device

MAX_LEN = 128  # tokens per side; longer verses are truncated for training only


@dataclass
class Pairs:
    src: list[list[int]]  # ends with </s> (the tokenizer's post-processor)
    tgt: list[list[int]]  # plain target tokens


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def encode_pairs(tokenizer: Tokenizer, rows: list[dict[str, Any]]) -> Pairs:
    src = [e.ids[:MAX_LEN] for e in tokenizer.encode_batch([r["src"] for r in rows])]
    tgt = [e.ids[: MAX_LEN - 1] for e in tokenizer.encode_batch([r["tgt"] for r in rows], add_special_tokens=False)]
    return Pairs(src, tgt)


def pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def token_batches(pairs: Pairs, max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length whose padded size stays under ``max_tokens`` target+source tokens."""
    order = sorted(range(len(pairs.src)), key=lambda i: (len(pairs.tgt[i]), len(pairs.src[i]), rng.random()))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = len(pairs.src[i]) + len(pairs.tgt[i]) + 1
        if current and max(longest, size) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    return batches


class TranslationTask:
    def __init__(self, data_dir: Path, tokenizer: Tokenizer, special: dict[str, int], max_tokens: int = 4096,
                 label_smoothing: float = 0.1) -> None:
        self.tokenizer, self.special, self.max_tokens = tokenizer, special, max_tokens
        self.label_smoothing = label_smoothing
        self.train = encode_pairs(tokenizer, read_jsonl(data_dir / "train.jsonl"))
        self.valid = encode_pairs(tokenizer, read_jsonl(data_dir / "valid.jsonl"))

    def collate(self, pairs: Pairs, index: list[int]) -> tuple[Tensor, ...]:
        bos, eos, pad_id = self.special["bos"], self.special["eos"], self.special["pad"]
        src, src_mask = pad([pairs.src[i] for i in index], pad_id)
        tgt_in, tgt_mask = pad([[bos] + pairs.tgt[i] for i in index], pad_id)
        labels, _ = pad([pairs.tgt[i] + [eos] for i in index], -100)
        return src, src_mask, tgt_in, tgt_mask, labels

    def train_batches(self, seed: int) -> Iterator[tuple[Tensor, ...]]:
        rng = random.Random(seed)
        while True:
            batches = token_batches(self.train, self.max_tokens, rng)
            rng.shuffle(batches)
            for index in batches:
                yield self.collate(self.train, index)

    def loss(self, model: Translator, batch: tuple[Tensor, ...],
             label_smoothing: float | None = None) -> tuple[Tensor, int]:
        src, src_mask, tgt_in, tgt_mask, labels = on_device(batch, model)
        logits = model(src, src_mask, tgt_in, tgt_mask)
        smoothing = self.label_smoothing if label_smoothing is None else label_smoothing
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=smoothing)
        return loss, int((labels != -100).sum())

    @torch.no_grad()
    def validate(self, model: Translator) -> dict[str, float]:
        total, count = 0.0, 0
        for index in token_batches(self.valid, self.max_tokens, random.Random(0)):
            loss, n = self.loss(model, self.collate(self.valid, index), label_smoothing=0.0)
            total, count = total + float(loss) * n, count + n
        return {"val_loss": total / count}


def translate_corpus(model: Translator, tokenizer: Tokenizer, sources: list[str], num_beams: int = 1,
                     length_penalty: float = 1.0, no_repeat_ngram: int = 0, batch_size: int = 32) -> list[str]:
    """Translate a list of sentences: batched greedy (num_beams=1) or beam search one by one."""
    model.eval()
    pad_id = model.config.special_tokens["pad"]
    encoded = [e.ids[:MAX_LEN] for e in tokenizer.encode_batch(sources)]
    out: list[str] = []
    if num_beams == 1:
        for start in range(0, len(encoded), batch_size):
            src, mask = pad(encoded[start : start + batch_size], pad_id)
            for ids in translate_greedy(model, src, mask, max_new_tokens=2 * src.shape[1] + 10):
                out.append(tokenizer.decode(ids))
    else:
        for ids in encoded:
            src, mask = pad([ids], pad_id)
            best = beam_search(model, src, mask, num_beams, 2 * len(ids) + 10, length_penalty, no_repeat_ngram)
            out.append(tokenizer.decode(best[0].tokens) if best else "")
    return out


def evaluate_bleu(model: Translator, tokenizer: Tokenizer, path: Path, limit: int | None = None,
                  **decode: Any) -> dict[str, Any]:
    rows = read_jsonl(path)[:limit]
    hypotheses = translate_corpus(model, tokenizer, [r["src"] for r in rows], **decode)
    references = [r["tgt"] for r in rows]
    return {
        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
        "sentences": len(rows),
        "examples": [{"src": r["src"], "ref": r["tgt"], "hyp": h}
                     for r, h in list(zip(rows, hypotheses, strict=False))[:3]],
    }
