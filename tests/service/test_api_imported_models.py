"""Imported checkpoints through the running server: the same tokens as transformers' own generate(),
greedy and beam 4, the same class scores; and several models of one task served side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from model.importing import hf_parity
from tests.service.hf_reference import Serving, generate, reference, served_translations, serving_artifacts, tokenizer

MAX_NEW = 8
SOURCES = ["The movie was wonderful, a delight from start to finish.", "Dull.", "And God said, let there be light."]


@pytest.fixture
def serving_imports(serving: Serving, hf_imports: Path) -> Serving:
    return serving_artifacts(serving, hf_imports / "artifacts")


async def test_gpt2_greedy_tokens_match_transformers(serving_imports: Any, hf_imports: Path) -> None:
    model, tok = reference(hf_imports, "gpt2"), tokenizer(hf_imports, "gpt2")
    async with serving_imports(models="gpt2") as s:
        for prompt in SOURCES:
            r = await s.client.post("/v1/generate", json={"prompt": prompt, "temperature": 0, "logprobs": True,
                                                          "max_new_tokens": MAX_NEW, "model": "gpt2"})
            assert r.status_code == 200, r.text
            served = [t["id"] for t in r.json()["tokens"]]
            ids = torch.tensor([tok.encode(prompt).ids])
            expected = generate(model, ids, do_sample=False, max_new_tokens=MAX_NEW,
                                pad_token_id=model.config.eos_token_id)
            assert served == expected[0, ids.shape[1]:].tolist(), prompt


@pytest.mark.parametrize("family", ["marian", "bart"])
@pytest.mark.parametrize("num_beams", [1, 4])
async def test_translation_tokens_match_transformers(
    serving_imports: Any, hf_imports: Path, family: str, num_beams: int
) -> None:
    model, tok = reference(hf_imports, family), tokenizer(hf_imports, family)
    served = [t["text"] for t in await served_translations(serving_imports, family, SOURCES, num_beams, MAX_NEW)]
    for source, text in zip(SOURCES, served, strict=True):
        ids = torch.tensor([tok.encode(source).ids])
        out = generate(model, ids, num_beams=num_beams, do_sample=False, max_new_tokens=MAX_NEW, length_penalty=1.0,
                       early_stopping=False, no_repeat_ngram_size=0)
        expected = tok.decode(out[0, 1:].tolist(), skip_special_tokens=True)  # after the start token
        assert text == expected, (source, num_beams)


async def test_bert_class_scores_match_transformers(serving_imports: Any, hf_imports: Path) -> None:
    model = reference(hf_imports, "bert")
    async with serving_imports(models="bert") as s:
        r = await s.client.post("/v1/classify", json={"text": SOURCES, "model": "bert"})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
    specials = json.loads((hf_imports / "artifacts" / "bert" / "config.json").read_text())["special_tokens"]
    inputs = hf_parity.reference_inputs("bert", tokenizer(hf_imports, "bert"), specials, SOURCES)
    expected = hf_parity.hf_logits(model, "bert", inputs).softmax(-1).numpy()
    num_labels = model.config.num_labels
    assert num_labels is not None
    id2label = cast("dict[int, str]", model.config.id2label)  # the config's __post_init__ makes the keys ints
    labels = [id2label[i] for i in range(num_labels)]
    for result, row in zip(results, expected, strict=True):
        assert result["label"] == labels[int(row.argmax())]
        np.testing.assert_allclose([result["scores"][label] for label in labels], row, atol=1e-4)


async def test_every_folder_is_served_and_the_first_of_each_task_is_its_default(
    serving: Any, tiny_artifacts: Path, hf_imports: Path, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    for folder in (tiny_artifacts / "classifier", tiny_artifacts / "generator", *(hf_imports / "artifacts").iterdir()):
        (root / folder.name).symlink_to(folder)
    async with serving(artifacts_dir=root) as s:  # SERVE_MODELS unset: every folder
        cards = {c["id"]: c for c in (await s.client.get("/v1/models")).json()["data"]}
        assert set(cards) == {"classifier", "generator", "bart", "bert", "gpt2", "marian"}
        defaults = {c["task"]: c["id"] for c in cards.values() if c["default"]}
        assert defaults == {"classification": "classifier", "generation": "generator", "translation": "bart"}

        plain = await s.client.post("/v1/classify", json={"text": "A fine film."})
        named = await s.client.post("/v1/classify", json={"text": "A fine film.", "model": "bert"})
        assert plain.json()["model"] == "classifier" and named.json()["model"] == "bert"
        assert set(named.json()["results"][0]["scores"]) == {"negative", "neutral", "positive"}
        completion = await s.client.post("/v1/completions", json={"model": "gpt2", "prompt": "Dull.", "max_tokens": 2})
        assert completion.status_code == 200 and completion.json()["model"] == "gpt2"

        wrong_task = await s.client.post("/v1/classify", json={"text": "A fine film.", "model": "gpt2"})
        unknown = await s.client.post("/v1/translate", json={"text": "Hello.", "model": "nope"})
        for r in (wrong_task, unknown):
            assert r.status_code == 404 and r.json()["error"]["field"] == "model", r.text
        assert "['classifier', 'bert']" in wrong_task.json()["error"]["message"]


async def test_a_folder_whose_config_names_another_model_is_refused(
    serving: Any, tiny_artifacts: Path, tmp_path: Path
) -> None:
    import shutil

    from service.runtime.artifact import ArtifactError

    shutil.copytree(tiny_artifacts / "classifier", tmp_path / "sentiment")
    with pytest.raises(ArtifactError, match="names the model 'classifier' but its folder is 'sentiment'"):
        async with serving(artifacts_dir=tmp_path):
            pass
