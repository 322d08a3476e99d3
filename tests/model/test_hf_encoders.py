"""The encoder families beside BERT (RoBERTa, XLM-RoBERTa, DistilBERT), a cross-encoder and the embedder
import rules, against transformers itself on small random checkpoints built in the tests (the
``hf_encoder_imports`` fixture): the PyTorch port within 1e-5, the exported graph within 1e-4."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from model.importing import hf_parity
from model.importing.hf_import import CheckpointError, Imported, import_checkpoint, read_hf_config
from model.importing.hf_tokenizer import load_tokenizer, special_tokens
from model.importing.sentence_transformers_folder import read_sentence_transformer
from model.network.embedder import Embedder
from scripts import import_checkpoint as cli
from tests.hf_checkpoints import ENCODER_CHECKPOINTS, SENTENCE_TRANSFORMER_MAX_LENGTH

TEXTS = [
    "The movie was wonderful, a delight from start to finish.",
    "Dull.",
    "We the people, in order to form a more perfect union, and God said: let there be light!",
]
EMBEDDERS = [name for name, task in ENCODER_CHECKPOINTS.items() if task == "embedding"]
CLASSIFIERS = [name for name, task in ENCODER_CHECKPOINTS.items() if task == "classification"]


def imported(checkpoints: Path, name: str) -> tuple[Imported, str, dict[str, torch.Tensor], torch.Tensor]:
    """Our model imported from checkpoint ``name``, its family, a padded batch and the real positions."""
    folder = checkpoints / name
    embedding = read_sentence_transformer(folder).options if (folder / "modules.json").is_file() else None
    hf = read_hf_config(folder)
    family = str(hf["model_type"])
    tokenizer = load_tokenizer(folder, family)
    specials = special_tokens(folder, family, hf, tokenizer)
    result = import_checkpoint(folder, specials, embedding=embedding)
    inputs = hf_parity.reference_inputs(family, tokenizer, specials, TEXTS)
    return result, family, inputs, inputs["attention_mask"].bool()


@pytest.mark.parametrize("name", list(ENCODER_CHECKPOINTS))
def test_pytorch_port_matches_transformers(hf_encoder_imports: Path, name: str) -> None:
    result, family, inputs, keep = imported(hf_encoder_imports / "checkpoints", name)
    headless = result.kind == "embedder"
    reference = hf_parity.load_hf_model(hf_encoder_imports / "checkpoints" / name, family, has_head=not headless)
    ours = hf_parity.ours_logits(result.model, family, inputs)
    theirs = hf_parity.hf_logits(reference, family, inputs)
    assert ours.shape == theirs.shape
    assert hf_parity.max_abs_diff(ours, theirs, keep) < 1e-5
    assert result.kind == ("embedder" if ENCODER_CHECKPOINTS[name] == "embedding" else "classifier")


@pytest.mark.parametrize("name", list(ENCODER_CHECKPOINTS))
def test_exported_graph_matches_transformers(hf_encoder_imports: Path, name: str) -> None:
    """Logits, or for an embedder the graph's pooled vector against transformers' hidden states mean-pooled."""
    result, family, inputs, keep = imported(hf_encoder_imports / "checkpoints", name)
    artifact = hf_encoder_imports / "artifacts" / name
    headless = isinstance(result.model, Embedder)
    reference = hf_parity.fp16_rounded(  # the graph stores fp16 weights: compare on the same rounding
        hf_parity.load_hf_model(hf_encoder_imports / "checkpoints" / name, family, has_head=not headless))
    if headless:
        expected = hf_parity.hf_embeddings(reference, inputs, "mean")
    else:
        expected = hf_parity.hf_logits(reference, family, inputs)
    graph = hf_parity.onnx_logits(artifact, family, inputs)
    assert graph.shape == tuple(expected.shape)
    assert hf_parity.max_abs_diff(graph, expected, keep) < 1e-4


@pytest.mark.parametrize("name", ["roberta", "xlm-roberta", "distilbert", "roberta-base"])
def test_families_without_token_types_have_no_token_type_input(hf_encoder_imports: Path, name: str) -> None:
    config = json.loads((hf_encoder_imports / "artifacts" / name / "config.json").read_text())
    assert [i["name"] for i in config["graphs"]["encoder"]["inputs"]] == ["input_ids", "attention_mask"]
    assert config["dims"]["n_token_types"] == 0


def test_roberta_positions_start_after_the_padding_id(hf_encoder_imports: Path) -> None:
    hf = read_hf_config(hf_encoder_imports / "checkpoints" / "roberta")
    config = json.loads((hf_encoder_imports / "artifacts" / "roberta" / "config.json").read_text())
    assert config["max_positions"] == hf["max_position_embeddings"] - hf["pad_token_id"] - 1


def test_cross_encoder_is_a_one_label_classifier(hf_encoder_imports: Path) -> None:
    config = json.loads((hf_encoder_imports / "artifacts" / "cross-encoder" / "config.json").read_text())
    assert config["task"] == "classification" and len(config["labels"]) == 1
    assert config["graphs"]["encoder"]["outputs"][0]["shape"] == ["batch", 1]
    assert "token_type_ids" in [i["name"] for i in config["graphs"]["encoder"]["inputs"]]  # (query, text) pairs


def test_sentence_transformers_folder_imports_as_its_pooling_says(hf_encoder_imports: Path) -> None:
    config = json.loads((hf_encoder_imports / "artifacts" / "sentence-transformer" / "config.json").read_text())
    assert config["task"] == "embedding" and "labels" not in config
    assert (config["pooling"], config["normalize"], config["dimensions_truncatable"]) == ("mean", True, False)
    assert config["max_positions"] == SENTENCE_TRANSFORMER_MAX_LENGTH


def test_headless_encoder_imports_as_an_unnormalised_mean_embedder(hf_encoder_imports: Path) -> None:
    config = json.loads((hf_encoder_imports / "artifacts" / "roberta-base" / "config.json").read_text())
    card = json.loads((hf_encoder_imports / "artifacts" / "roberta-base" / "card.json").read_text())
    assert (config["task"], config["pooling"], config["normalize"]) == ("embedding", "mean", False)
    assert any("imported as an embedding model" in note for note in card["notes"])


@pytest.mark.parametrize("name", ["roberta", "xlm-roberta", "distilbert"])
def test_tokenizer_json_encodes_like_transformers(hf_encoder_imports: Path, name: str) -> None:
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(hf_encoder_imports / "checkpoints" / name))
    ours = Tokenizer.from_file(str(hf_encoder_imports / "artifacts" / name / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    assert ours.encode(TEXTS[0], TEXTS[1]).ids == theirs(TEXTS[0], TEXTS[1])["input_ids"]


def test_random_head_only_when_asked_by_name(hf_encoder_imports: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = hf_encoder_imports / "checkpoints" / "roberta-base"
    assert cli.main([str(checkpoint), "--out", str(tmp_path / "tuned"), "--no-int8",
                     "--random-head", "bad,good"]) == 0
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert (config["task"], config["labels"]) == ("classification", ["bad", "good"])
    assert "WARNING: no trained classification head" in capsys.readouterr().err


def test_distilbert_sinusoidal_positions_are_refused(hf_encoder_imports: Path, tmp_path: Path) -> None:
    folder = tmp_path / "distilbert"
    shutil.copytree(hf_encoder_imports / "checkpoints" / "distilbert", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"sinusoidal_pos_embds": True}))
    with pytest.raises(CheckpointError, match="sinusoidal_pos_embds=true is not supported"):
        import_checkpoint(folder, {})


def test_unsupported_sentence_transformers_pooling_is_refused(hf_encoder_imports: Path, tmp_path: Path) -> None:
    folder = tmp_path / "st"
    shutil.copytree(hf_encoder_imports / "checkpoints" / "sentence-transformer", folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling | {"pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(CheckpointError, match="pooling_mode_mean_sqrt_len_tokens is not supported"):
        read_sentence_transformer(folder)


def test_xlm_roberta_sentencepiece_model_alone_is_converted(tmp_path: Path) -> None:
    """A checkpoint with sentencepiece.bpe.model and no tokenizer.json: transformers converts it, ids unchanged."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    from tests.hf_checkpoints import CORPUS

    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_prefix=str(tmp_path / "sentencepiece.bpe"),
                                   vocab_size=100, model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    (tmp_path / "sentencepiece.bpe.vocab").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    ours = load_tokenizer(tmp_path, "xlm-roberta")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    specials = special_tokens(tmp_path, "xlm-roberta", {}, ours)
    assert (specials["cls"], specials["pad"], specials["sep"]) == (0, 1, 2)  # XLM-R's fairseq ids
