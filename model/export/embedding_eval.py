"""An embedder artifact measured by its own graph: vectors for a batch of texts (right-padded, as the server
pads), and a small retrieval check, each paraphrase's nearest neighbour among real sentences being its partner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from model.export.golden import open_session

# Paraphrase pairs: (i, i + 1) for even i.
PARAPHRASES = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The cat is sleeping on the windowsill.",
    "A kitten naps by the window.",
    "The stock market fell sharply today.",
    "Share prices dropped steeply this afternoon.",
    "How do I reset my password?",
    "What are the steps to change a forgotten password?",
    "The train to Paris was delayed by two hours.",
    "Our train into Paris arrived two hours late.",
    "She is cooking pasta for dinner.",
    "He is preparing spaghetti for the evening meal.",
]
# Unrelated sentences among which the partners must still come first.
DISTRACTORS = [
    "In the beginning God created the heavens and the earth.",
    "Fellow citizens, the state of the union is strong.",
    "The movie was wonderful, a delight from start to finish.",
    "A dull, tedious and predictable story with no heart.",
    "Photosynthesis converts light energy into chemical energy.",
    "Café, piñata, naïve: words borrowed into English.",
    "Dull.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from a distance, wondering why.",
]
SENTENCES = PARAPHRASES + DISTRACTORS


def embed(folder: Path, texts: list[str]) -> np.ndarray:
    """The graph's ``embeddings`` (as pooled, not normalised) for ``texts``, one right-padded batch."""
    config = json.loads((folder / "config.json").read_text())
    graph = config["graphs"]["encoder"]
    session = open_session(folder, graph["file"], config)
    encodings = Tokenizer.from_file(str(folder / config["tokenizer"])).encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), config["special_tokens"]["pad"], dtype=np.int64)
    types, mask = np.zeros_like(ids), np.zeros_like(ids)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        ids[i, :n], types[i, :n], mask[i, :n] = e.ids, e.type_ids, 1
    available = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    feeds = {i["name"]: available[i["name"]] for i in graph["inputs"]}
    (vectors,) = session.run(["embeddings"], feeds)  # onnxruntime is untyped: one float array per output
    embeddings: np.ndarray = vectors
    return embeddings


def normalized(vectors: np.ndarray) -> np.ndarray:
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


def nearest_neighbours(vectors: np.ndarray) -> np.ndarray:
    """For each row, the index of the most cosine-similar other row."""
    unit = normalized(vectors)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    nearest: np.ndarray = similarity.argmax(1)
    return nearest


def paraphrase_retrieval(folder: Path) -> dict[str, Any]:
    """Share of paraphrase sentences whose nearest neighbour among SENTENCES is their partner."""
    nearest = nearest_neighbours(embed(folder, SENTENCES))
    hits = sum(int(nearest[i] == i ^ 1) for i in range(len(PARAPHRASES)))
    return {"paraphrase_top1": hits / len(PARAPHRASES), "paraphrase_sentences": len(PARAPHRASES),
            "distractors": len(DISTRACTORS)}
