"""Imported checkpoints against transformers itself: logits on padded batches, tokenizers, clear errors.

The checkpoints are small random models built with transformers from configs (tests/hf_checkpoints.py),
imported by the same code as ``python -m scripts.import_checkpoint`` (the ``hf_imports`` fixture).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from model.importing import hf_parity
from model.importing.hf_import import CheckpointError, import_checkpoint, read_hf_config
from model.importing.hf_tokenizer import load_tokenizer, special_tokens
from model.network.generator import Generator
from scripts import import_checkpoint as cli
from tests.hf_checkpoints import FAMILIES

TEXTS = [
    "The movie was wonderful, a delight from start to finish.",
    "Dull.",
    "We the people, in order to form a more perfect union, and God said: let there be light!",
]


def reference(family: str, checkpoint: Path) -> tuple[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor | None]:
    artifact_config = checkpoint.parent.parent / "artifacts" / family / "config.json"
    specials = json.loads(artifact_config.read_text())["special_tokens"]
    tokenizer = Tokenizer.from_file(str(artifact_config.parent / "tokenizer.json"))
    inputs = hf_parity.reference_inputs(family, tokenizer, specials, TEXTS)
    model = hf_parity.load_hf_model(checkpoint, family)
    return model, inputs, hf_parity.real_positions(family, inputs)


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_graph_matches_transformers_on_a_padded_batch(hf_imports: Path, family: str) -> None:
    model, inputs, keep = reference(family, hf_imports / "checkpoints" / family)
    graph = hf_parity.onnx_logits(hf_imports / "artifacts" / family, family, inputs)
    # The graph stores its weights in fp16: compare with transformers on the same rounded weights.
    expected = hf_parity.hf_logits(hf_parity.fp16_rounded(model), family, inputs)
    assert graph.shape == tuple(expected.shape)
    assert hf_parity.max_abs_diff(graph, expected, keep) < 1e-4
    # And against the original fp32 weights the difference is only the fp16 storage.
    assert hf_parity.max_abs_diff(graph, hf_parity.hf_logits(model, family, inputs), keep) < 5e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_imported_pytorch_model_matches_transformers(hf_imports: Path, family: str) -> None:
    checkpoint = hf_imports / "checkpoints" / family
    hf = read_hf_config(checkpoint)
    tokenizer = load_tokenizer(checkpoint, family)
    imported = import_checkpoint(checkpoint, special_tokens(checkpoint, family, hf, tokenizer))
    model, inputs, keep = reference(family, checkpoint)
    ours = hf_parity.ours_logits(imported.model, family, inputs)
    assert hf_parity.max_abs_diff(ours, hf_parity.hf_logits(model, family, inputs), keep) < 1e-5
    assert imported.notes == []  # every part came from the checkpoint


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_json_encodes_like_the_checkpoints_tokenizer(hf_imports: Path, family: str) -> None:
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(hf_imports / "checkpoints" / family))
    ours = Tokenizer.from_file(str(hf_imports / "artifacts" / family / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    if family == "bert":  # sentence pairs keep their segment ids
        pair = theirs(TEXTS[0], TEXTS[1])
        encoded = ours.encode(TEXTS[0], TEXTS[1])
        assert (encoded.ids, encoded.type_ids) == (pair["input_ids"], pair["token_type_ids"])


def test_card_records_origin_and_parity(hf_imports: Path) -> None:
    card = json.loads((hf_imports / "artifacts" / "marian" / "card.json").read_text())
    assert card["source"]["model_type"] == "marian" and "source.spm" in card["source"]["files"]
    assert card["parity"]["onnx_vs_fp16_rounded_max_abs_diff"] < 1e-4
    assert card["parity"]["torch_fp32_max_abs_diff"] < 1e-5
    config = json.loads((hf_imports / "artifacts" / "marian" / "config.json").read_text())
    assert config["name"] == "marian" and config["task"] == "translation"


# --- errors -----------------------------------------------------------------------------------------------


def copy_checkpoint(hf_imports: Path, family: str, tmp_path: Path) -> Path:
    folder = tmp_path / family
    shutil.copytree(hf_imports / "checkpoints" / family, folder)
    return folder


def test_unsupported_architecture_says_what_was_found(hf_imports: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(hf_imports, "gpt2", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    unknown = {"model_type": "pegasus", "architectures": ["PegasusForConditionalGeneration"]}
    (folder / "config.json").write_text(json.dumps(config | unknown))
    with pytest.raises(CheckpointError, match=r"unsupported architecture: model_type='pegasus'.*PegasusForConditional"):
        import_checkpoint(folder, {})


def test_missing_weights_name_the_files_found(hf_imports: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(hf_imports, "gpt2", tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights: expected one of model.safetensors, pytorch_model.bin"):
        import_checkpoint(folder, {})


def test_pytorch_model_bin_is_read_with_weights_only(hf_imports: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    folder = copy_checkpoint(hf_imports, "gpt2", tmp_path)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    imported = import_checkpoint(folder, {"pad": 0, "eos": 0, "bos": 0})
    assert imported.family == "gpt2"


@pytest.mark.parametrize(("change", "message"), [
    ("extra", r"tensors the mapping does not use: \['h.0.attn.extra'\]"),
    ("missing", r"lacks tensor 'h.1.mlp.c_fc.weight'"),
])
def test_mapping_is_checked_both_ways(hf_imports: Path, tmp_path: Path, change: str, message: str) -> None:
    from safetensors.torch import load_file, save_file

    folder = copy_checkpoint(hf_imports, "gpt2", tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    if change == "extra":
        tensors["transformer.h.0.attn.extra"] = torch.zeros(3)
    else:
        del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=message):
        import_checkpoint(folder, {"pad": 0, "eos": 0, "bos": 0})


def test_options_our_layers_lack_are_refused(hf_imports: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(hf_imports, "bert", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"position_embedding_type": "relative_key"}))
    with pytest.raises(CheckpointError, match="position_embedding_type='relative_key' is not supported"):
        import_checkpoint(folder, {})


def test_marian_without_its_sentencepiece_files_is_a_clear_error(hf_imports: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(hf_imports, "marian", tmp_path)
    (folder / "target.spm").unlink()
    with pytest.raises(CheckpointError, match=r"missing \['target.spm'\]"):
        load_tokenizer(folder, "marian")


def test_cli_reports_errors_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert cli.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_untied_output_head_is_imported_as_its_own_matrix(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, tie_word_embeddings=False,
                        bos_token_id=0, eos_token_id=0)
    reference_model = GPT2LMHeadModel(config).eval()
    reference_model.save_pretrained(str(tmp_path))
    imported = import_checkpoint(tmp_path, {"pad": 0, "eos": 0, "bos": 0})
    model = imported.model
    assert isinstance(model, Generator)
    head, embedding = model.lm_head.weight, model.tok_emb.weight
    assert head.data_ptr() != embedding.data_ptr() and not torch.equal(head, embedding)
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}
    ours = hf_parity.ours_logits(imported.model, "gpt2", inputs)
    assert hf_parity.max_abs_diff(ours, hf_parity.hf_logits(reference_model, "gpt2", inputs), mask.bool()) < 1e-5
