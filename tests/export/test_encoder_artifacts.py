"""The tiny embedder and reranker artifacts (model/export/tiny.py): config.json's embedding keys, the
graphs against their PyTorch references, and the pooling modes against a plain loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")  # the training extra
import onnxruntime as ort
import torch

from model.export.graphs import export_model, round_weights_to_fp16
from model.export.tiny import RERANKER_LABEL, TINY_MAX_POSITIONS, build_tiny_encoder
from model.network.config import ClassifierConfig
from model.network.embedder import POOLING_MODES, Embedder, EmbeddingOptions, pool

ATOL = 1e-4


def batch(vocab: int, with_types: bool = True) -> dict[str, np.ndarray]:
    g = np.random.default_rng(0)
    ids = g.integers(5, vocab, size=(3, 7)).astype(np.int64)
    mask = np.ones((3, 7), dtype=np.int64)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        types = np.zeros_like(ids)
        types[0, 4:] = 1
        feeds["token_type_ids"] = types
    return feeds


def run(folder: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "encoder.onnx"), providers=["CPUExecutionProvider"])
    output: np.ndarray = session.run(None, feeds)[0]
    return output


def torch_output(model: torch.nn.Module, feeds: dict[str, np.ndarray]) -> np.ndarray:
    types = torch.from_numpy(feeds["token_type_ids"]) if "token_type_ids" in feeds else None
    with torch.no_grad():
        out, _ = model(torch.from_numpy(feeds["input_ids"]), types, torch.from_numpy(feeds["attention_mask"]))
    output: np.ndarray = out.numpy()
    return output


@pytest.mark.parametrize("name", ["embedder", "reranker"])
def test_tiny_encoder_graph_matches_its_pytorch_reference(name: str, tiny_encoder_artifacts: Path) -> None:
    model, _, _ = build_tiny_encoder(name)
    round_weights_to_fp16(model)
    model.eval()
    config = json.loads((tiny_encoder_artifacts / name / "config.json").read_text())
    feeds = batch(config["vocab_size"])
    np.testing.assert_allclose(run(tiny_encoder_artifacts / name, feeds), torch_output(model, feeds), atol=ATOL)


def test_tiny_embedder_config_states_the_embedding_keys(tiny_encoder_artifacts: Path) -> None:
    config = json.loads((tiny_encoder_artifacts / "embedder" / "config.json").read_text())
    assert config["task"] == "embedding" and "labels" not in config
    assert (config["pooling"], config["normalize"], config["dimensions_truncatable"]) == ("mean", True, False)
    assert config["max_positions"] == TINY_MAX_POSITIONS
    outputs = config["graphs"]["encoder"]["outputs"]
    assert outputs[0] == {"name": "embeddings", "dtype": "float32", "shape": ["batch", config["dims"]["d_model"]]}


def test_tiny_reranker_is_a_one_label_classifier(tiny_encoder_artifacts: Path) -> None:
    config = json.loads((tiny_encoder_artifacts / "reranker" / "config.json").read_text())
    assert config["task"] == "classification" and config["labels"] == [RERANKER_LABEL]
    assert config["graphs"]["encoder"]["outputs"][0]["shape"] == ["batch", 1]


def loop_pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    rows = []
    for h, m in zip(hidden, mask, strict=False):
        real = h[m.astype(bool)]
        rows.append({"mean": real.mean(0), "cls": h[0], "max": real.max(0), "lasttoken": real[-1]}[mode])
    return np.stack(rows)


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_pooling_reads_only_the_real_tokens(mode: str) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 6, 4, generator=g)
    hidden[:, 3:] += 100.0  # padding that would win a max or shift a mean if it were read
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    np.testing.assert_allclose(pool(hidden, mask, mode).numpy(), loop_pool(hidden.numpy(), mask.numpy(), mode),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("token_types", [0, 1])
def test_embedder_without_a_token_type_input_exports_two_inputs(token_types: int, tmp_path: Path) -> None:
    """type_vocab_size 0 (DistilBERT) or 1 (RoBERTa: the one row is added to every token): no token_type_ids."""
    from model.export.tiny import TINY_CORPUS
    from model.training import tokenization

    tokenizer = tokenization.train_classifier_tokenizer(TINY_CORPUS * 4, 300)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    torch.manual_seed(0)
    config = ClassifierConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_heads=2, d_ff=32, n_layers=1,
                              max_positions=32, type_vocab_size=token_types,
                              special_tokens=tokenization.CLASSIFIER_IDS)
    model = Embedder(config, EmbeddingOptions(pooling="max", normalize=False))
    config_json = export_model("embedder", model, tmp_path / "tokenizer.json", tmp_path / "out", int8=False)
    assert [i["name"] for i in config_json["graphs"]["encoder"]["inputs"]] == ["input_ids", "attention_mask"]
    assert config_json["dims"]["n_token_types"] == 0 and config_json["pooling"] == "max"
    feeds = batch(config.vocab_size, with_types=False)
    np.testing.assert_allclose(run(tmp_path / "out", feeds), torch_output(model.eval(), feeds), atol=ATOL)


def test_one_folder_serves_every_tiny_artifact(tiny_artifacts_with_encoders: Path, tiny_artifacts: Path) -> None:
    from model.export.tiny import TINY_ENCODERS

    served = {p.name for p in tiny_artifacts_with_encoders.iterdir() if (p / "config.json").is_file()}
    kinds = {p.name for p in tiny_artifacts.iterdir() if (p / "config.json").is_file()}
    assert served == kinds | set(TINY_ENCODERS) and not kinds & set(TINY_ENCODERS)
