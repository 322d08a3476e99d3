"""huggingface_hub's InferenceClient against the running server: TGI text generation at the server's
root URL, text classification and translation at /models/{name}, as an Inference Endpoint URL, and every
text task at every one of those URLs (its own answer, or an HTTP error)."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient, TextClassificationOutputElement, TranslationOutput
from huggingface_hub.errors import HfHubHTTPError

from tests.service.test_api_hf import CLIENT_CALLS, own_requests, sent


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


def _answers_its_task(task: str, out: Any, labels: set[str]) -> bool:
    """Whether `out`, what the client returned, is `task`'s answer."""
    if task == "text-generation":
        return isinstance(out, str) or (isinstance(out, list) and all(isinstance(x, str) for x in out))
    if task == "text-classification":
        return bool(out) and all(isinstance(x, TextClassificationOutputElement) and x.label in labels for x in out)
    if task == "translation":
        return isinstance(out, TranslationOutput) and bool(out.translation_text)
    if task == "feature-extraction":
        return isinstance(out, np.ndarray) and out.dtype == np.float32 and out.ndim == 1 and out.size > 1
    return task == "sentence-similarity" and isinstance(out, list) and all(isinstance(x, float) for x in out)


def test_every_text_task_at_the_root_and_every_model(server) -> None:
    """Each text task of the client, at the server's root and at each /models/<name>: its own answer from a
    model of its task, or an HTTP error the client raises; never a 200 with another task's data, except at a
    model's URL given the very request the client sends for the model's own task (docs/clients.md)."""
    models = httpx.get(f"{server.url}/api/models", timeout=30).json()
    urls = {server.url: next(m for m in models if m["id"] == "generator")["tags"]}
    urls |= {f"{server.url}/models/{m['id']}": m["tags"] for m in models}
    labels = {label for m in models if m["pipeline_tag"] == "text-classification"
              for label in httpx.get(f"{server.url}/v1/models/{m['id']}", timeout=30).json()["labels"]}  # fmt: skip
    alike: list[tuple[str, str, str]] = []
    for url, served in urls.items():
        own = own_requests(tuple(served)) if url != server.url else []
        client = InferenceClient(model=url, timeout=120)
        for task, what, call in CLIENT_CALLS:
            where = (url, task, what)
            try:
                out = call(client)
            except HfHubHTTPError as error:
                status, kind = error.response.status_code, error.response.json()["error"]["type"]
                assert status in (406, 422) and kind in ("unsupported_task", "ambiguous_task", "not_acceptable"), where
                assert task not in served or (url == server.url and kind == "ambiguous_task"), where
                continue
            except Exception:  # the client could not read another task's answer
                assert task not in served and url != server.url and sent(call) in own, where
                alike.append(where)
                continue
            if task in served:
                assert _answers_its_task(task, out, labels), (where, out)
            else:
                assert url != server.url and sent(call) in own, (where, out)
                alike.append(where)
    assert not [where for where in alike if where[2] not in ("defaults", "top_k", "generate_parameters")], alike
