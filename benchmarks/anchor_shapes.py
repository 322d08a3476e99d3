"""What the anchor's rows measure (benchmarks/anchor.py and its engine processes, anchor_engines.py): the
texts, prompts and lengths of each workload, the Llama-shaped model's sizes, and what an engine offers for
each kind of model (Generating, Decoding, Translating, Encoding)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np

PROMPT_SEED = 0
SOURCE = "The committee approved the new budget after a long debate about the roads."  # 20 translator tokens
TEXT = "The movie was a delight from start to finish."  # a short sentence to classify
Batch = tuple[int, list[int]]  # (units, output tokens of each request)
Run = Callable[[int], Batch]  # a batch of n requests -> (units, output tokens of each)
Greedy = Callable[[list[list[int]]], list[list[int]]]  # prompts -> each one's greedy tokens
LLAMA = "llama"  # the Llama-shaped part: built at benchmark time (build_llama), not read from --artifacts


class LlamaSize(TypedDict):
    """transformers LlamaConfig fields of one --llama-size."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int


# Grouped-query attention (4 query heads per key/value head), SwiGLU, rope. "bench" costs a decode step real
# compute on 2 cores (about 3x the generator rows' model per token); "tiny" is for the smoke tests.
LLAMA_SIZES: dict[str, LlamaSize] = {
    "bench": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "intermediate_size": 1408, "vocab_size": 8192, "max_position_embeddings": 512},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 128},
}
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2, as Llama's
CHECK_PROMPTS = 4  # prompts whose greedy tokens ours and CTranslate2 must agree on


def dims(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    return {**config["dims"], "vocab_size": config["vocab_size"], "max_positions": config["max_positions"],
            "special_tokens": config["special_tokens"], "labels": len(config.get("labels", [0, 0]))}


def _encode(folder: Path, text: str) -> list[int]:
    """`text` as the model in `folder` tokenizes it; [] where that model is not among the rows' (not run)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    return Tokenizer.from_file(str(path)).encode(text).ids if path.is_file() else []


class Shapes:
    def __init__(self, args: argparse.Namespace, artifacts: Path) -> None:
        self.new_tokens: int = args.new_tokens
        self.target_tokens: int = args.target_tokens
        self.prompt: list[int] = []  # a random prompt, where the generator is among the rows' models
        if (artifacts / "generator" / "config.json").is_file():
            vocab = dims(artifacts / "generator")["vocab_size"]
            self.prompt = [int(i) for i in np.random.default_rng(PROMPT_SEED).integers(10, vocab, args.prompt_tokens)]
        self.source = _encode(artifacts / "translator", SOURCE)
        self.text = _encode(artifacts / "classifier", TEXT)
        self.embed_text = _encode(artifacts / "embedder", TEXT)  # the classifier's sentence, the embedder's tokens
        self.llama_size: str = args.llama_size
        rng = np.random.default_rng(PROMPT_SEED + 1)
        vocab = LLAMA_SIZES[self.llama_size]["vocab_size"]
        self.llama_prompt = [int(i) for i in rng.integers(len(LLAMA_SPECIALS), vocab, args.prompt_tokens)]
        # Prompts of other lengths for the agreement check of ours and CTranslate2.
        self.check_prompts = [[int(i) for i in rng.integers(len(LLAMA_SPECIALS), vocab, n)]
                              for n in np.linspace(2, max(2, args.prompt_tokens), CHECK_PROMPTS).astype(int)]


@dataclass(frozen=True)
class Setup:
    """What an engine process loads its model from."""

    artifacts: Path  # our served artifacts (tokenizers, dims)
    work: Path  # where build_hf_and_ct2 and build_llama saved the models
    shapes: Shapes
    threads: int


class Generating(Protocol):
    def generate(self, n: int) -> Batch: ...


class Decoding(Generating, Protocol):
    """A generator whose greedy tokens can be compared with another engine's."""

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]: ...


class Translating(Protocol):
    def translate(self, beams: int) -> Run: ...


class Encoding(Protocol):
    """A classifier or an embedder: one sequence a request."""

    def encode(self, n: int) -> Batch: ...


def shape_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--target-tokens", type=int, default=30)
    parser.add_argument("--llama-size", choices=sorted(LLAMA_SIZES), default="bench",
                        help="dims of the Llama-shaped rows' model (built with random weights)")
