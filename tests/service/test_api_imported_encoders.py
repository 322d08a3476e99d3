"""Imported encoder families through the running server: RoBERTa, XLM-RoBERTa and DistilBERT classifiers on
/v1/classify, a cross-encoder on /rerank, a sentence-transformers folder and a headless RoBERTa on
/v1/embeddings, each against `transformers` itself (the checkpoints of tests/hf_checkpoints.py; the import
stores float16 weights, so the reference runs the same float16-rounded weights)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from model.importing import hf_parity

TEXTS = ["A wonderful, moving film.", "Dull and far too long, I left early.", "It was fine.", "Bonjour !"]
QUERY = "what is a good film"


def reference(imports: Path, name: str) -> tuple[torch.nn.Module, str, dict[str, Any]]:
    """The transformers model of checkpoint `name` (float16-rounded), its family and its artifact's config."""
    checkpoint = imports / "checkpoints" / name
    family = json.loads((checkpoint / "config.json").read_text())["model_type"]
    config = json.loads((imports / "artifacts" / name / "config.json").read_text())
    has_head = config["task"] == "classification"
    return hf_parity.fp16_rounded(hf_parity.load_hf_model(checkpoint, family, has_head)), family, config


def inputs(imports: Path, name: str, family: str, config: dict[str, Any], texts: list[str]) -> dict[str, torch.Tensor]:
    tokenizer = Tokenizer.from_file(str(imports / "artifacts" / name / "tokenizer.json"))
    return hf_parity.reference_inputs(family, tokenizer, config["special_tokens"], texts)


@pytest.fixture
def serving_encoders(
    serving: Callable[..., AbstractAsyncContextManager[Any]], hf_encoder_imports: Path
) -> Callable[[str], AbstractAsyncContextManager[Any]]:
    return lambda name: serving(artifacts_dir=hf_encoder_imports / "artifacts", models=name)


@pytest.mark.parametrize("name", ["roberta", "xlm-roberta", "distilbert"])
async def test_class_scores_match_transformers(serving_encoders: Any, hf_encoder_imports: Path, name: str) -> None:
    model, family, config = reference(hf_encoder_imports, name)
    expected = hf_parity.hf_logits(model, family, inputs(hf_encoder_imports, name, family, config, TEXTS))
    async with serving_encoders(name) as s:
        reply = await s.client.post("/v1/classify", json={"text": TEXTS, "model": name})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    np.testing.assert_allclose([r["logits"] for r in results], expected.numpy(), atol=1e-4)
    probs = expected.softmax(-1).numpy()
    np.testing.assert_allclose([list(r["scores"].values()) for r in results], probs, atol=1e-4)


async def test_rerank_scores_match_the_cross_encoder(serving_encoders: Any, hf_encoder_imports: Path) -> None:
    model, family, config = reference(hf_encoder_imports, "cross-encoder")
    tokenizer = Tokenizer.from_file(str(hf_encoder_imports / "artifacts" / "cross-encoder" / "tokenizer.json"))
    pairs = [tokenizer.encode(QUERY, text) for text in TEXTS]
    width = max(len(e.ids) for e in pairs)
    ids = torch.tensor([e.ids + [config["special_tokens"]["pad"]] * (width - len(e.ids)) for e in pairs])
    types = torch.tensor([e.type_ids + [0] * (width - len(e.ids)) for e in pairs])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in pairs])
    logits = hf_parity.hf_logits(model, family, {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
    expected = logits[:, 0].numpy()
    async with serving_encoders("cross-encoder") as s:
        raw = (await s.client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True})).json()
        scored = (await s.client.post("/rerank", json={"query": QUERY, "texts": TEXTS})).json()
    assert [r["index"] for r in raw] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([r["score"] for r in sorted(raw, key=lambda r: r["index"])], expected, atol=1e-4)
    sigmoid = 1 / (1 + np.exp(-expected))
    np.testing.assert_allclose([r["score"] for r in sorted(scored, key=lambda r: r["index"])], sigmoid, atol=1e-4)


@pytest.mark.parametrize("name", ["sentence-transformer", "roberta-base"])
async def test_embeddings_match_transformers_pooling(
    serving_encoders: Any, hf_encoder_imports: Path, name: str
) -> None:
    model, family, config = reference(hf_encoder_imports, name)
    pooled = hf_parity.hf_embeddings(model, inputs(hf_encoder_imports, name, family, config, TEXTS), config["pooling"])
    expected = pooled.numpy()
    if config["normalize"]:
        expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    async with serving_encoders(name) as s:
        reply = await s.client.post("/v1/embeddings", json={"input": TEXTS, "model": name})
        alone = [(await s.client.post("/v1/embeddings", json={"input": t, "model": name})).json() for t in TEXTS]
    assert reply.status_code == 200, reply.text
    batched = np.asarray([item["embedding"] for item in reply.json()["data"]])
    np.testing.assert_allclose(batched, expected, atol=1e-4)
    np.testing.assert_allclose([a["data"][0]["embedding"] for a in alone], batched, atol=1e-5)
