"""T5 (ReLU, tied head), Flan-T5 (gated GELU) and M2M100 imports against transformers: the PyTorch port within
1e-5, the exported graphs within 1e-4 (against the weights rounded as the graphs store them), the exported
decoder fed one token at a time through its KV cache equal to teacher forcing, and the options that are not
built refused by name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from model.importing import hf_parity
from model.importing.hf_artifact import import_to_artifact
from model.importing.hf_import import CheckpointError
from tests.hf_checkpoints import SEQ2SEQ_CHECKPOINTS

NAMES = sorted(SEQ2SEQ_CHECKPOINTS)


@pytest.mark.parametrize("name", NAMES)
def test_parity_with_transformers(hf_seq2seq_imports: Path, name: str) -> None:
    parity = json.loads((hf_seq2seq_imports / "artifacts" / name / "card.json").read_text())["parity"]
    assert parity["checked"] and parity["compared"] == "logits"
    assert parity["torch_fp32_max_abs_diff"] < 1e-5
    assert parity["onnx_vs_fp16_rounded_max_abs_diff"] < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_cached_decoding_equals_teacher_forcing(hf_seq2seq_imports: Path, name: str) -> None:
    """The exported decoder one token at a time (positions after the cache: T5's relative bias) gives the logits
    of the whole prefix at once."""
    artifact = hf_seq2seq_imports / "artifacts" / name
    config = json.loads((artifact / "config.json").read_text())
    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    inputs = hf_parity.reference_inputs(name if name == "m2m_100" else "t5", tok, config["special_tokens"],
                                        hf_parity.SAMPLE_TEXTS)
    inputs["decoder_attention_mask"][:] = 1
    full = hf_parity.onnx_logits(artifact, "t5", inputs)
    np_inputs = {k: v.numpy() for k, v in inputs.items()}
    cross = {k: v for k, v in hf_parity.onnx_outputs(artifact, "encoder", {
        "input_ids": np_inputs["input_ids"], "attention_mask": np_inputs["attention_mask"]}).items()
        if k.startswith("cross.")}
    target = np_inputs["decoder_input_ids"]
    past = hf_parity.empty_cache(config, len(target), "past_key_values")
    for step in range(target.shape[1]):
        out = hf_parity.onnx_outputs(artifact, "decoder", {
            "input_ids": target[:, step : step + 1], "attention_mask": np.ones((len(target), step + 1), np.int64),
            "position_ids": np.full((len(target), 1), step), "encoder_attention_mask": np_inputs["attention_mask"],
            **cross, **past})
        np.testing.assert_allclose(out["logits"][:, 0], full[:, step], atol=1e-4)
        past = {k.replace("present.", "past_key_values."): v for k, v in out.items() if k.startswith("present.")}


def test_m2m100_languages_and_forced_target_are_in_the_artifact(hf_seq2seq_imports: Path) -> None:
    artifact = hf_seq2seq_imports / "artifacts" / "m2m_100"
    config = json.loads((artifact / "config.json").read_text())
    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    assert config["languages"] == {code: tok.token_to_id(f"__{code}__") for code in ("de", "en", "fr")}
    assert config["forced_bos_token_id"] == tok.token_to_id("__fr__")
    assert config["special_tokens"]["bos"] == config["special_tokens"]["eos"]  # M2M100 starts from </s>


def test_t5_task_prefix_is_on_the_card(hf_seq2seq_imports: Path) -> None:
    card = json.loads((hf_seq2seq_imports / "artifacts" / "t5" / "card.json").read_text())
    assert any("translate English to French: " in note for note in card["notes"])
    assert "languages" not in json.loads((hf_seq2seq_imports / "artifacts" / "t5" / "config.json").read_text())


@pytest.mark.parametrize(("name", "file", "change", "message"), [
    ("t5", "config.json", {"feed_forward_proj": "gated-tanh"}, "feed_forward_proj='gated-tanh' is not supported"),
    ("t5", "config.json", {"d_kv": 4}, "d_kv=4 with num_heads=4"),
    ("t5", "generation_config.json", {"length_penalty": 0.6}, "length_penalty=0.6 is not supported"),
    ("t5", "generation_config.json", {"no_repeat_ngram_size": 3}, "no_repeat_ngram_size=3 is not supported"),
    ("m2m_100", "generation_config.json", {"eos_token_id": [2, 5]}, "eos_token_id=[2, 5] is not supported"),
    ("m2m_100", "generation_config.json", {"decoder_start_token_id": 0}, "decoder_start_token_id=0 differs"),
    ("m2m_100", "generation_config.json", {"repetition_penalty": 1.2}, "repetition_penalty=1.2 is not supported"),
    ("m2m_100", "generation_config.json", {"bad_words_ids": [[5]]}, "bad_words_ids=[[5]] is not supported"),
])
def test_unsupported_options_are_refused_by_name(
    hf_seq2seq_imports: Path, tmp_path: Path, name: str, file: str, change: dict[str, object], message: str
) -> None:
    folder = tmp_path / name
    shutil.copytree(hf_seq2seq_imports / "checkpoints" / name, folder)
    path = folder / file
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps(data | change))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        import_to_artifact(folder, tmp_path / "out", name, int8=False)
