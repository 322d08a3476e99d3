"""Generator training task (next-token prediction on random windows) and perplexity evaluation."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor

from model.data.baselines import token_stream
from model.data.generation import read_documents
from model.network.generator import Generator
from model.training.loop import on_device


def load_stream(tokenizer: Tokenizer, path: Path, eos_id: int) -> np.ndarray:
    return token_stream(tokenizer, read_documents(path), eos_id)


class GenerationTask:
    def __init__(self, data_dir: Path, tokenizer: Tokenizer, eos_id: int, block_size: int = 128,
                 batch_size: int = 32, max_val_windows: int = 64) -> None:
        self.block_size, self.batch_size = block_size, batch_size
        self.train = torch.from_numpy(load_stream(tokenizer, data_dir / "train.txt", eos_id))
        valid = torch.from_numpy(load_stream(tokenizer, data_dir / "valid.txt", eos_id))
        n = min(max_val_windows, (len(valid) - 1) // block_size)
        self.valid_windows = valid[: n * block_size + 1].unfold(0, block_size + 1, block_size)  # [n, T+1]

    def train_batches(self, seed: int) -> Iterator[Tensor]:
        rng = np.random.default_rng(seed)
        while True:
            starts = rng.integers(0, len(self.train) - self.block_size - 1, self.batch_size)
            yield torch.stack([self.train[s : s + self.block_size + 1] for s in starts])

    def loss(self, model: Generator, batch: Tensor) -> tuple[Tensor, int]:
        batch = on_device(batch, model)
        logits, _, _ = model(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()), batch[:, 1:].numel()

    @torch.no_grad()
    def validate(self, model: Generator) -> dict[str, float]:
        losses = [float(self.loss(model, chunk)[0]) for chunk in torch.split(self.valid_windows, 16)]
        loss = sum(losses) / len(losses)
        return {"val_loss": loss, "val_perplexity": math.exp(loss)}


@torch.no_grad()
def stream_perplexity(model: Generator, stream: np.ndarray, window: int = 128, stride: int = 64,
                      batch_size: int = 32) -> float:
    """Perplexity over every token of ``stream`` after the first, each scored exactly once (as the n-gram
    baseline scores them), with sliding windows so each has at least ``window - stride`` tokens of context."""
    model.eval()
    ids = torch.from_numpy(stream)
    last = len(ids) - 1  # targets are ids[1..last]
    spans, scored_until = [], 0  # (begin, end, how many trailing targets to score)
    for begin in range(0, last, stride):
        end = min(begin + window, last)
        spans.append((begin, end, end - scored_until))
        scored_until = end
        if end == last:
            break
    total_nll = 0.0
    for i in range(0, len(spans), batch_size):
        group = spans[i : i + batch_size]
        width = max(end - begin for begin, end, _ in group)
        inputs = torch.zeros(len(group), width, dtype=torch.long)
        targets = torch.full((len(group), width), -100, dtype=torch.long)
        for row, (begin, end, new) in enumerate(group):
            n = end - begin
            inputs[row, :n] = ids[begin:end]
            targets[row, n - new : n] = ids[end - new + 1 : end + 1]
        logits, _, _ = model(inputs)  # right padding: causal attention keeps real positions exact
        total_nll += float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"))
    return math.exp(total_nll / last)
