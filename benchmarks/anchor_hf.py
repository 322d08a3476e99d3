"""Hugging Face eager, one of the engines the anchor compares ours with: each loads one saved reference and
runs n requests as one batch."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.anchor_shapes import Batch, Run, Setup


class _HF:
    """Eager PyTorch on one saved reference (work/<artifact>/hf), of the class it was saved as."""

    def __init__(self, setup: Setup, artifact: str) -> None:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        torch.set_num_threads(setup.threads)
        self.torch, self.s = torch, setup.shapes
        folder = setup.work / artifact / "hf"
        (architecture,) = json.loads((folder / "config.json").read_text())["architectures"]
        model_class: Any = getattr(transformers, architecture)  # one of the Reference models'
        self.model = model_class.from_pretrained(folder).eval()


class HFGenerator(_HF):
    """transformers' generate, greedy."""

    def __init__(self, setup: Setup, artifact: str, prompt: list[int]) -> None:
        super().__init__(setup, artifact)
        self.prompt = prompt

    def generate(self, n: int) -> Batch:
        ids = self.torch.tensor([self.prompt] * n)
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=self.s.new_tokens, min_new_tokens=self.s.new_tokens)
        lengths = [out.shape[1] - ids.shape[1]] * n
        return sum(lengths), lengths


class HFTranslator(_HF):
    """transformers' generate, greedy or beam search."""

    def translate(self, beams: int) -> Run:
        def run(n: int) -> Batch:
            ids = self.torch.tensor([self.s.source] * n)
            with self.torch.inference_mode():
                out = self.model.generate(
                    ids, attention_mask=self.torch.ones_like(ids), num_beams=beams, do_sample=False,
                    max_new_tokens=self.s.target_tokens, min_new_tokens=self.s.target_tokens,
                    no_repeat_ngram_size=0, length_penalty=1.0, early_stopping=False)
            lengths = [out.shape[1] - 1] * n  # after the decoder start token
            return sum(lengths), lengths
        return run


class HFClassifier(_HF):
    def encode(self, n: int) -> Batch:
        ids = self.torch.tensor([self.s.text] * n)
        with self.torch.inference_mode():
            self.model(input_ids=ids, attention_mask=self.torch.ones_like(ids),
                       token_type_ids=self.torch.zeros_like(ids)).logits.softmax(-1)
        return n, [0] * n


class HFEmbedder(_HF):
    """BertModel, then mean pooling and normalisation in torch."""

    def encode(self, n: int) -> Batch:
        ids = self.torch.tensor([self.s.embed_text] * n)
        mask = self.torch.ones_like(ids)
        with self.torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask, token_type_ids=self.torch.zeros_like(ids))
            real = mask.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
            pooled = (hidden.last_hidden_state * real).sum(1) / real.sum(1).clamp(min=1e-9)
            self.torch.nn.functional.normalize(pooled, dim=-1)
        return n, [0] * n
