"""huggingface_hub's InferenceClient against a running server with the tiny embedder, reranker and classifier:
feature_extraction and sentence_similarity at /models/embedder, and a 422 naming the model's task when a
model is asked for a task it does not serve (the client posts every task to the URL it is given: the task
shows in the body, or in the Inference API's /pipeline/<task> URL)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.clients.conftest import Server

TEXTS = ["the cat sat on the mat", "a dog ran in the park"]


def test_feature_extraction(encoder_server: Server) -> None:
    client = InferenceClient(model=f"{encoder_server.url}/models/embedder")
    expected = np.array(httpx.post(f"{encoder_server.url}/embed", json={"inputs": TEXTS}, timeout=30).json())
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (32,) and one.dtype == np.float32
    np.testing.assert_allclose(one, expected[0], atol=1e-6)
    np.testing.assert_allclose(client.feature_extraction(TEXTS), expected, atol=1e-6)
    raw = client.feature_extraction(TEXTS[0], normalize=False)
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    cut = client.feature_extraction("cat dog " * 100, truncate=True, truncation_direction="left")
    assert cut.shape == (32,)


def test_sentence_similarity(encoder_server: Server) -> None:
    client = InferenceClient(model=f"{encoder_server.url}/models/embedder")
    scores = client.sentence_similarity(TEXTS[0], other_sentences=[TEXTS[0], TEXTS[1]])
    assert len(scores) == 2 and abs(scores[0] - 1) < 1e-5 and scores[1] < scores[0]


def test_a_task_the_model_does_not_serve_is_a_422_naming_its_task(encoder_server: Server) -> None:
    classifier = InferenceClient(model=f"{encoder_server.url}/models/classifier")
    with pytest.raises(HfHubHTTPError) as token:
        classifier.token_classification("The cat sat in Paris", aggregation_strategy="simple")
    assert token.value.response.status_code == 422
    assert "serves text-classification, not token-classification" in token.value.response.json()["error"]["message"]
    named = InferenceClient(model=f"{encoder_server.url}/models/classifier/pipeline/token-classification")
    with pytest.raises(HfHubHTTPError) as by_url:
        named.token_classification("The cat sat in Paris")
    assert by_url.value.response.status_code == 422 and by_url.value.response.json()["error"]["field"] == "task"
    with pytest.raises(HfHubHTTPError) as similarity:
        classifier.sentence_similarity("a", other_sentences=["b"])
    assert "not sentence-similarity" in similarity.value.response.json()["error"]["message"]
    embedder = InferenceClient(model=f"{encoder_server.url}/models/embedder")
    with pytest.raises(HfHubHTTPError) as classification:
        embedder.text_classification("a fine film")
    message = classification.value.response.json()["error"]["message"]
    assert "serves feature-extraction and sentence-similarity" in message
    assert classifier.text_classification("a fine film")[0].label in ("negative", "positive")
