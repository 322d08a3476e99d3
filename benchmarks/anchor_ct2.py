"""CTranslate2, one of the engines the anchor compares ours with: each loads one converted model and runs n
requests as one batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.anchor_shapes import Batch, Run, Setup

if TYPE_CHECKING:
    import ctranslate2


class _CT2:
    """CTranslate2 on one converted model; token strings come from its vocabulary.json."""

    def __init__(self, path: Path, setup: Setup, compute_type: str) -> None:
        self.s = setup.shapes
        self.vocab: list[str] = json.loads(next(f for f in (path / "vocabulary.json", path / "shared_vocabulary.json")
                                                if f.is_file()).read_text())
        self.opts: dict[str, Any] = {"device": "cpu", "intra_threads": setup.threads, "inter_threads": 1,
                                     "compute_type": compute_type}


class CT2Generator(_CT2):
    def __init__(self, path: Path, setup: Setup, prompt: list[int], compute_type: str = "float32") -> None:
        import ctranslate2

        super().__init__(path, setup, compute_type)
        self.prompt = [self.vocab[i] for i in prompt]
        self.generator = ctranslate2.Generator(str(path), **self.opts)

    def generate(self, n: int) -> Batch:
        out = self.generator.generate_batch(
            [self.prompt] * n, max_length=self.s.new_tokens, min_length=self.s.new_tokens,
            include_prompt_in_result=False, beam_size=1)
        lengths = [len(r.sequences_ids[0]) for r in out]
        return sum(lengths), lengths

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy tokens of each prompt up to the end token (not included), at most new_tokens."""
        out = self.generator.generate_batch([[self.vocab[i] for i in p] for p in prompts],
                                            max_length=self.s.new_tokens, include_prompt_in_result=False, beam_size=1)
        return [list(r.sequences_ids[0]) for r in out]


class CT2Translator(_CT2):
    def __init__(self, path: Path, setup: Setup) -> None:
        import ctranslate2

        super().__init__(path, setup, "float32")
        self.source = [self.vocab[i] for i in self.s.source]
        self.translator = ctranslate2.Translator(str(path), **self.opts)

    def translate(self, beams: int) -> Run:
        def run(n: int) -> Batch:
            out = self.translator.translate_batch(
                [self.source] * n, beam_size=beams, max_decoding_length=self.s.target_tokens,
                min_decoding_length=self.s.target_tokens, no_repeat_ngram_size=0, length_penalty=1.0)
            lengths = [len(r.hypotheses[0]) for r in out]
            return sum(lengths), lengths
        return run


class _CT2Encoder(_CT2):
    def __init__(self, path: Path, setup: Setup, ids: list[int]) -> None:
        import ctranslate2

        super().__init__(path, setup, "float32")
        self.ids = ids
        self.encoder = ctranslate2.Encoder(str(path), **self.opts)

    def forward(self, n: int) -> ctranslate2.EncoderForwardOutput:
        return self.encoder.forward_batch([self.ids] * n, token_type_ids=[[0] * len(self.ids)] * n)


class CT2Classifier(_CT2Encoder):
    """BertModel's pooled output in CTranslate2, then the classifier's head (head.npz) in numpy."""

    def __init__(self, path: Path, setup: Setup, head: Path) -> None:
        super().__init__(path, setup, setup.shapes.text)
        weights = np.load(head)
        self.head_w, self.head_b = weights["weight"].T.copy(), weights["bias"]

    def encode(self, n: int) -> Batch:
        logits = np.asarray(self.forward(n).pooler_output) @ self.head_w + self.head_b
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return n, [0] * n


class CT2Embedder(_CT2Encoder):
    """BertModel's last hidden state in CTranslate2, mean-pooled and normalised in numpy."""

    def __init__(self, path: Path, setup: Setup) -> None:
        super().__init__(path, setup, setup.shapes.embed_text)

    def encode(self, n: int) -> Batch:
        mean_pool(np.asarray(self.forward(n).last_hidden_state), np.ones((n, len(self.ids)), np.float32))
        return n, [0] * n


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, S, D] hidden states, [B, S] mask -> [B, D] unit vectors: the embedder's mean pooling and normalize."""
    pooled: np.ndarray = (hidden * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    unit: np.ndarray = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return unit
