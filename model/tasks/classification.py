"""Classifier tasks: MLM + NSP pretraining (Devlin et al. 2019) and fine-tuning on [CLS]."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Encoding, Tokenizer
from torch import Tensor

from model.network.classifier import Classifier
from model.training.loop import on_device

MASK_RATE, MASK_TOKEN_SHARE, RANDOM_TOKEN_SHARE = 0.15, 0.8, 0.1  # the rest stays unchanged


def mask_tokens(ids: Tensor, maskable: Tensor, mask_id: int, vocab_size: int, n_special: int,
                generator: torch.Generator, word_starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """BERT masking: choose 15% of the maskable positions; of those 80% -> [MASK], 10% -> a random
    token, 10% unchanged. Returns (inputs, labels) with labels -100 where nothing is predicted.

    With ``word_starts`` ([B, S] bool, True where a token begins a word) whole words are chosen: a
    word's continuation pieces ("##ing") are predicted together with its first piece, so the model
    cannot fill a masked piece from the rest of its own word (Devlin et al.'s whole-word masking)."""
    draw = torch.rand(ids.shape, generator=generator) < MASK_RATE
    if word_starts is None:
        chosen = draw & maskable
    else:
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        word_start_of = torch.where(word_starts, positions, 0).cummax(dim=1).values  # each token's first piece
        chosen = (draw & word_starts).gather(1, word_start_of) & maskable
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    to_mask = chosen & (roll < MASK_TOKEN_SHARE)
    to_random = chosen & (roll >= MASK_TOKEN_SHARE) & (roll < MASK_TOKEN_SHARE + RANDOM_TOKEN_SHARE)
    inputs = ids.masked_fill(to_mask, mask_id)
    random_ids = torch.randint(n_special, vocab_size, ids.shape, generator=generator)
    return torch.where(to_random, random_ids, inputs), labels


def read_documents(path: Path) -> list[list[str]]:
    """pretrain.txt: one sentence per line, documents separated by blank lines."""
    docs = [[s for s in block.splitlines() if s.strip()] for block in path.read_text().split("\n\n")]
    return [d for d in docs if d]


def pad_pairs(encodings: list[Encoding], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    width = max(len(e.ids) for e in encodings)
    ids = torch.full((len(encodings), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(encodings), width), dtype=torch.long)
    mask = torch.zeros((len(encodings), width), dtype=torch.long)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        ids[i, :n], types[i, :n], mask[i, :n] = torch.tensor(e.ids), torch.tensor(e.type_ids), 1
    return ids, types, mask


def segment_pair(docs: list[list[str]], rng: random.Random, sentences: int = 2) -> tuple[str, str, int]:
    """One NSP example (A, B, label): label 0 when B is the text that follows A in its document, 1 when
    B comes from a random document. A document of several sentences is cut between sentences (up to
    ``sentences`` on each side); a one-sentence document (most review snippets and tweets) is cut
    between words, and its random B is then a word-cut tail too, so the two labels look alike."""
    doc = rng.choice(docs)
    if len(doc) >= 2:
        cut = rng.randint(1, len(doc) - 1)
        a, following = " ".join(doc[max(0, cut - sentences) : cut]), " ".join(doc[cut : cut + sentences])
        if rng.random() < 0.5:
            return a, following, 0
        other = rng.choice(docs)
        start = rng.randrange(len(other))
        return a, " ".join(other[start : start + sentences]), 1
    words = doc[0].split()
    cut = rng.randint(1, len(words) - 1)
    if rng.random() < 0.5:
        return " ".join(words[:cut]), " ".join(words[cut:]), 0
    other_words = rng.choice(rng.choice(docs)).split()
    tail = rng.randint(0, max(0, len(other_words) - 2))
    return " ".join(words[:cut]), " ".join(other_words[tail:]), 1


class PretrainTask:
    """MLM (whole-word masking) + NSP over sentence pairs of at most ``max_len`` tokens: short pairs,
    so that a CPU minute holds many updates (the fine-tuning texts are single snippets anyway)."""

    def __init__(self, pretrain_path: Path, tokenizer: Tokenizer, special: dict[str, int], max_len: int = 64,
                 batch_size: int = 32, seed: int = 0, n_valid_docs: int = 400, whole_words: bool = True) -> None:
        self.tokenizer, self.special, self.batch_size = tokenizer, special, batch_size
        self.vocab_size = tokenizer.get_vocab_size()
        docs = [d for d in read_documents(pretrain_path) if len(d) >= 2 or len(d[0].split()) >= 2]
        random.Random(seed).shuffle(docs)
        self.valid_docs, self.train_docs = docs[:n_valid_docs], docs[n_valid_docs:]
        vocab = tokenizer.get_vocab()
        continuation = torch.zeros(self.vocab_size, dtype=torch.bool)
        continuation[[i for token, i in vocab.items() if token.startswith("##")]] = True
        self.continuation = continuation if whole_words else None
        tokenizer.enable_truncation(max_len, strategy="longest_first")
        self.valid_batches = [self.make_batch(self.valid_docs, random.Random(i), torch.Generator().manual_seed(i))
                              for i in range(8)]

    def make_batch(self, docs: list[list[str]], rng: random.Random, torch_rng: torch.Generator) -> tuple[Tensor, ...]:
        examples = [segment_pair(docs, rng) for _ in range(self.batch_size)]
        ids, types, mask = pad_pairs(self.tokenizer.encode_batch([(a, b) for a, b, _ in examples]),
                                     self.special["pad"])
        maskable = (mask == 1) & (ids != self.special["cls"]) & (ids != self.special["sep"])
        word_starts = None if self.continuation is None else ~self.continuation[ids]
        n_special = max(self.special.values()) + 1
        inputs, labels = mask_tokens(ids, maskable, self.special["mask"], self.vocab_size, n_special, torch_rng,
                                     word_starts)
        return inputs, types, mask, labels, torch.tensor([label for _, _, label in examples])

    def train_batches(self, seed: int) -> Iterator[tuple[Tensor, ...]]:
        rng, torch_rng = random.Random(seed), torch.Generator().manual_seed(seed)
        while True:
            yield self.make_batch(self.train_docs, rng, torch_rng)

    def losses(self, model: Classifier, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
        inputs, types, mask, labels, nsp = on_device(batch, model)
        hidden, _ = model.encode(inputs, types, mask)
        predicted = labels != -100
        mlm = F.cross_entropy(model.mlm_logits(hidden[predicted]), labels[predicted])
        nsp_logits = model.nsp_head(model.pooled(hidden))
        return mlm, F.cross_entropy(nsp_logits, nsp), (nsp_logits.argmax(-1) == nsp).float().mean()

    def loss(self, model: Classifier, batch: tuple[Tensor, ...]) -> tuple[Tensor, int]:
        mlm, nsp, _ = self.losses(model, batch)
        return mlm + nsp, len(batch[0])

    @torch.no_grad()
    def validate(self, model: Classifier) -> dict[str, float]:
        results = [self.losses(model, b) for b in self.valid_batches]
        mlm = sum(float(r[0]) for r in results) / len(results)
        nsp = sum(float(r[1]) for r in results) / len(results)
        acc = sum(float(r[2]) for r in results) / len(results)
        return {"val_loss": mlm + nsp, "val_mlm_loss": mlm, "val_nsp_loss": nsp, "val_nsp_accuracy": acc}


class MaskedLMTask:
    """MLM alone over single sentences: task-adaptive pretraining (Gururangan et al. 2020), a pretrained
    encoder's masked-language modelling continued on the task's own unlabelled text before fine-tuning."""

    def __init__(self, train_texts: list[str], valid_texts: list[str], tokenizer: Tokenizer,
                 special: dict[str, int], max_len: int = 128, batch_size: int = 128) -> None:
        self.tokenizer, self.special, self.batch_size = tokenizer, special, batch_size
        self.vocab_size = tokenizer.get_vocab_size()
        self.train_texts, self.valid_texts = train_texts, valid_texts
        vocab = tokenizer.get_vocab()
        self.continuation = torch.zeros(self.vocab_size, dtype=torch.bool)
        self.continuation[[i for token, i in vocab.items() if token.startswith("##")]] = True
        tokenizer.enable_truncation(max_len)
        self.valid_batches = [self.make_batch(valid_texts[i : i + batch_size], torch.Generator().manual_seed(i))
                              for i in range(0, len(valid_texts), batch_size)]

    def make_batch(self, texts: list[str], torch_rng: torch.Generator) -> tuple[Tensor, ...]:
        ids, types, mask = pad_pairs(self.tokenizer.encode_batch(texts), self.special["pad"])
        maskable = (mask == 1) & (ids != self.special["cls"]) & (ids != self.special["sep"])
        inputs, labels = mask_tokens(ids, maskable, self.special["mask"], self.vocab_size,
                                     max(self.special.values()) + 1, torch_rng, ~self.continuation[ids])
        return inputs, types, mask, labels

    def train_batches(self, seed: int) -> Iterator[tuple[Tensor, ...]]:
        rng, torch_rng = random.Random(seed), torch.Generator().manual_seed(seed)
        texts = list(self.train_texts)
        while True:  # epochs of shuffled sentences, masked afresh each time (dynamic masking, as RoBERTa)
            rng.shuffle(texts)
            for i in range(0, len(texts) - self.batch_size + 1, self.batch_size):
                yield self.make_batch(texts[i : i + self.batch_size], torch_rng)

    def mlm_loss(self, model: Classifier, batch: tuple[Tensor, ...]) -> Tensor:
        inputs, types, mask, labels = on_device(batch, model)
        hidden, _ = model.encode(inputs, types, mask)
        predicted = labels != -100
        return F.cross_entropy(model.mlm_logits(hidden[predicted]), labels[predicted])

    def loss(self, model: Classifier, batch: tuple[Tensor, ...]) -> tuple[Tensor, int]:
        return self.mlm_loss(model, batch), len(batch[0])

    @torch.no_grad()
    def validate(self, model: Classifier) -> dict[str, float]:
        losses = [float(self.mlm_loss(model, b)) for b in self.valid_batches]
        return {"val_loss": sum(losses) / len(losses)}


def read_labelled(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class FineTuneTask:
    """Sentence classification with a head on the pooled [CLS] state."""

    def __init__(self, data_dir: Path, tokenizer: Tokenizer, special: dict[str, int], batch_size: int = 32,
                 max_len: int = 128, train_rows: list[dict[str, Any]] | None = None) -> None:
        """The splits of ``data_dir``; ``train_rows``, when given, are trained on instead of its train.jsonl."""
        tokenizer.enable_truncation(max_len)
        self.tokenizer, self.pad_id, self.batch_size = tokenizer, special["pad"], batch_size
        self.splits = {name: read_labelled(data_dir / f"{name}.jsonl") for name in ("train", "valid", "test")}
        if train_rows is not None:
            self.splits["train"] = train_rows

    def collate(self, rows: list[dict[str, Any]]) -> tuple[Tensor, ...]:
        """(ids, types, mask, labels), and each row's probability of the positive label where the training
        rows carry one (``positive``: soft targets, FineTuneRecipe.rater_scale)."""
        ids, types, mask = pad_pairs(self.tokenizer.encode_batch([r["text"] for r in rows]), self.pad_id)
        labels = torch.tensor([r["label"] for r in rows])
        if "positive" not in rows[0]:
            return ids, types, mask, labels
        positive = torch.tensor([r["positive"] for r in rows], dtype=torch.float32)
        return ids, types, mask, labels, torch.stack([1 - positive, positive], dim=1)

    def steps_per_epoch(self) -> int:
        return -(-len(self.splits["train"]) // self.batch_size)

    def train_batches(self, seed: int, bucket_batches: int = 50) -> Iterator[tuple[Tensor, ...]]:
        """Shuffled epochs; within each chunk of ``bucket_batches`` batches rows are sorted by length,
        so a batch pads little (compute is the bottleneck on CPU), then the batches are shuffled."""
        rng = random.Random(seed)
        rows = list(self.splits["train"])
        chunk = self.batch_size * bucket_batches
        while True:
            rng.shuffle(rows)
            batches = []
            for c in range(0, len(rows), chunk):
                by_length = sorted(rows[c : c + chunk], key=lambda r: len(r["text"]))
                batches += [by_length[i : i + self.batch_size] for i in range(0, len(by_length), self.batch_size)]
            rng.shuffle(batches)
            for batch in batches:
                yield self.collate(batch)

    def loss(self, model: Classifier, batch: tuple[Tensor, ...]) -> tuple[Tensor, int]:
        ids, types, mask, labels, *soft = on_device(batch, model)
        logits, _ = model(ids, types, mask)
        return F.cross_entropy(logits, soft[0] if soft else labels), len(labels)

    @torch.no_grad()
    def logits(self, model: Classifier, split: str) -> Tensor:
        """``model``'s logits for every row of ``split``, in order, on the CPU."""
        rows, out = self.splits[split], []
        for i in range(0, len(rows), 64):
            ids, types, mask, *_ = on_device(self.collate(rows[i : i + 64]), model)
            out.append(model(ids, types, mask)[0].float().cpu())
        return torch.cat(out)

    def labels(self, split: str) -> Tensor:
        return torch.tensor([r["label"] for r in self.splits[split]])

    def evaluate(self, model: Classifier, split: str) -> dict[str, float]:
        return classification_scores(self.logits(model, split), self.labels(split))

    def validate(self, model: Classifier) -> dict[str, float]:
        metrics = self.evaluate(model, "valid")
        return {"val_loss": metrics["loss"], "val_accuracy": metrics["accuracy"], "val_f1": metrics["f1"]}


def classification_scores(logits: Tensor, labels: Tensor) -> dict[str, float]:
    """Mean cross-entropy, accuracy and the positive label's F1 (label 1) of ``logits`` against ``labels``."""
    predicted = logits.argmax(-1)
    tp = int(((predicted == 1) & (labels == 1)).sum())
    fp = int(((predicted == 1) & (labels == 0)).sum())
    fn = int(((predicted == 0) & (labels == 1)).sum())
    return {"loss": float(F.cross_entropy(logits, labels)), "accuracy": float((predicted == labels).float().mean()),
            "f1": 2 * tp / max(1, 2 * tp + fp + fn)}
