"""huggingface_hub's InferenceClient against the running server: TGI text generation at the server's
root URL, text classification and translation at /models/{name}, as an Inference Endpoint URL."""

from __future__ import annotations

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError


@pytest.fixture(scope="module")
def client(server) -> InferenceClient:
    return InferenceClient(model=server.url, timeout=60)


def test_text_generation(client: InferenceClient) -> None:
    text = client.text_generation("The Congress of the United States", max_new_tokens=12)
    assert isinstance(text, str) and text
    details = client.text_generation("The Congress of the United States", max_new_tokens=12, details=True)
    assert details.generated_text == text  # greedy by default, as TGI
    assert details.details is not None
    assert details.details.finish_reason in ("length", "eos_token", "stop_sequence")
    assert details.details.generated_tokens == len(details.details.tokens) <= 12


def test_text_generation_stream(client: InferenceClient) -> None:
    whole = client.text_generation("Our nation must", max_new_tokens=16, seed=5, do_sample=True)
    pieces = list(client.text_generation("Our nation must", max_new_tokens=16, seed=5, do_sample=True, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == whole
    events = list(client.text_generation("Our nation must", max_new_tokens=8, stream=True, details=True))
    assert events[-1].details is not None and events[-1].generated_text == "".join(e.token.text for e in events)


def test_text_classification(server) -> None:
    client = InferenceClient(model=f"{server.url}/models/classifier")
    ranked = client.text_classification("A wonderful, moving film with brilliant performances.")
    assert ranked[0].score >= ranked[-1].score and abs(sum(r.score for r in ranked) - 1) < 1e-4
    assert len(client.text_classification("A dull, boring mess.", top_k=1)) == 1


def test_translation(server) -> None:
    client = InferenceClient(model=f"{server.url}/models/translator")
    out = client.translation("And God said, Let there be light: and there was light.")
    assert out.translation_text and "lumière" in out.translation_text.lower()


def test_info_and_health(server) -> None:
    # The client itself refuses these two calls unless the provider is named (whatever the server).
    client = InferenceClient(model=server.url, provider="hf-inference")
    info = client.get_endpoint_info()
    assert info["model_id"] == "generator" and info["model_pipeline_tag"] == "text-generation"
    assert client.health_check()
    assert InferenceClient(model=f"{server.url}/models/classifier", provider="hf-inference").health_check()


def test_errors_surface(client: InferenceClient) -> None:
    with pytest.raises(HfHubHTTPError) as bad:
        client.text_generation("x", max_new_tokens=5, top_p=0.0)
    assert bad.value.response.status_code == 422


def test_huge_top_k_is_a_422_naming_it(client: InferenceClient) -> None:
    with pytest.raises(HfHubHTTPError) as bad:
        client.text_generation("x", max_new_tokens=2, top_k=2**63)
    assert bad.value.response.status_code == 422
    assert bad.value.response.json()["error"]["field"] == "parameters.top_k"
