"""Non-neural baselines the trained models are compared with.

    python -m model.data.baselines [--data-dir data]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from tokenizers import Tokenizer

from model.data import read_jsonl
from model.data.generation import read_documents
from model.training.ngram import KneserNeyLM
from model.training.tokenization import GENERATOR_IDS

C_GRID = (1.0, 3.0, 10.0)


def tfidf_baseline(classification_dir: Path) -> dict[str, float]:
    """TF-IDF (word 1-2 grams) + logistic regression, C picked on valid; test accuracy and F1."""
    splits = {name: list(read_jsonl(classification_dir / f"{name}.jsonl")) for name in ("train", "valid", "test")}
    texts = {name: [e["text"] for e in rows] for name, rows in splits.items()}
    labels = {name: [e["label"] for e in rows] for name, rows in splits.items()}
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    features = {"train": vectorizer.fit_transform(texts["train"])}
    features |= {name: vectorizer.transform(texts[name]) for name in ("valid", "test")}
    models = [LogisticRegression(C=c, max_iter=1000).fit(features["train"], labels["train"]) for c in C_GRID]
    best = max(models, key=lambda m: accuracy_score(labels["valid"], m.predict(features["valid"])))
    predicted = best.predict(features["test"])
    return {"accuracy": accuracy_score(labels["test"], predicted), "f1": f1_score(labels["test"], predicted),
            "C": best.C}


def token_stream(tokenizer: Tokenizer, documents: list[str], eos_id: int) -> np.ndarray:
    """Token ids of the documents, each followed by the end-of-text id."""
    return np.concatenate([np.array(e.ids + [eos_id], dtype=np.int64) for e in tokenizer.encode_batch(documents)])


def ngram_baseline(generation_dir: Path, tokenizer_path: Path, order: int = 3) -> dict[str, float]:
    """Kneser-Ney n-gram perplexity on the generator's valid and test tokens."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    eos = GENERATOR_IDS["eos"]
    streams = {name: token_stream(tokenizer, read_documents(generation_dir / f"{name}.txt"), eos)
               for name in ("train", "valid", "test")}
    lm = KneserNeyLM(tokenizer.get_vocab_size(), order).fit(streams["train"])
    return {f"{name}_perplexity": lm.perplexity(streams[name]) for name in ("valid", "test")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    data_dir = parser.parse_args().data_dir
    print("classifier tf-idf:", tfidf_baseline(data_dir / "classification"))
    print("generator 3-gram:", ngram_baseline(data_dir / "generation", data_dir / "tokenizers" / "generator.json"))


if __name__ == "__main__":
    main()
