"""Llama, Qwen2 and Mistral checkpoints against transformers itself: the PyTorch port, the exported graph
(a padded batch, then decode steps through its KV cache of key/value heads), generation_config.json, and
the options that are refused by name.

The checkpoints are small random models built with transformers (tests/hf_checkpoints.py DECODER_CHECKPOINTS),
imported by the same code as ``python -m scripts.import_checkpoint`` (the ``hf_decoder_imports`` fixture).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from model.importing import hf_parity
from model.importing.hf_import import CheckpointError, import_checkpoint, read_hf_config
from model.importing.hf_tokenizer import load_tokenizer, special_tokens
from model.network.config import GeneratorConfig
from model.network.generator import Generator
from model.network.layers import RMSNorm
from tests.hf_checkpoints import DECODER_CHECKPOINTS, LLAMA_GENERATION

NAMES = list(DECODER_CHECKPOINTS)
TEXTS = [
    "The movie was wonderful, a delight from start to finish.",
    "Dull.",
    "We the people, in order to form a more perfect union, and God said: let there be light!",
]


def imported(folder: Path) -> tuple[str, Generator, dict[str, int]]:
    hf = read_hf_config(folder)
    family = hf["model_type"]
    specials = special_tokens(folder, family, hf, load_tokenizer(folder, family))
    model = import_checkpoint(folder, specials).model
    assert isinstance(model, Generator)  # every family here is a decoder
    return family, model, specials


def batch(folder: Path, family: str, specials: dict[str, int]) -> dict[str, torch.Tensor]:
    return hf_parity.reference_inputs(family, load_tokenizer(folder, family), specials, TEXTS)


@pytest.mark.parametrize("name", NAMES)
def test_pytorch_port_matches_transformers(hf_decoder_imports: Path, name: str) -> None:
    folder = hf_decoder_imports / "checkpoints" / name
    family, model, specials = imported(folder)
    inputs = batch(folder, family, specials)
    reference = hf_parity.load_hf_model(folder, family)
    ours = hf_parity.ours_logits(model, family, inputs)
    theirs = hf_parity.hf_logits(reference, family, inputs)
    assert hf_parity.max_abs_diff(ours, theirs, hf_parity.real_positions(family, inputs)) < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_exported_graph_matches_transformers_on_a_padded_batch(hf_decoder_imports: Path, name: str) -> None:
    folder, artifact = hf_decoder_imports / "checkpoints" / name, hf_decoder_imports / "artifacts" / name
    family = read_hf_config(folder)["model_type"]
    specials = json.loads((artifact / "config.json").read_text())["special_tokens"]
    inputs = batch(folder, family, specials)
    reference = hf_parity.fp16_rounded(hf_parity.load_hf_model(folder, family))  # the graph's fp16 weights
    graph = hf_parity.onnx_logits(artifact, family, inputs)
    assert hf_parity.max_abs_diff(graph, hf_parity.hf_logits(reference, family, inputs),
                                  hf_parity.real_positions(family, inputs)) < 1e-4


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
def test_decode_steps_through_the_graphs_cache_match_transformers(hf_decoder_imports: Path, name: str) -> None:
    """The import writes its cache in place (model/network/in_place.py): a right-padded prefill into buffers
    bound as both past and present, then one token per row and step at each row's own length. Each step's
    logits are those of transformers on the whole (left-padded) sequence; the buffers hold n_kv_heads heads
    and each step wrote its token's keys into them."""
    folder, artifact = hf_decoder_imports / "checkpoints" / name, hf_decoder_imports / "artifacts" / name
    config = json.loads((artifact / "config.json").read_text())
    kv_heads = config["dims"]["n_kv_heads"]
    assert kv_heads < config["dims"]["n_heads"]
    family = read_hf_config(folder)["model_type"]
    inputs = batch(folder, family, config["special_tokens"])
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    (rows, width), lengths = ids.shape, mask.sum(1)
    steps = np.random.default_rng(0).integers(3, config["vocab_size"], (rows, 3))
    session = hf_parity.session(artifact / "decoder.onnx")
    buffers = hf_parity.empty_cache(config, rows, "past_key_values", width + steps.shape[1])
    values = {name: ort.OrtValue.ortvalue_from_numpy(buffer) for name, buffer in buffers.items()}

    def run(input_ids: np.ndarray, total: np.ndarray, positions: np.ndarray) -> np.ndarray:
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids))
        binding.bind_cpu_input("attention_mask", (np.arange(total.max()) < total[:, None]).astype(np.int64))
        binding.bind_cpu_input("position_ids", np.ascontiguousarray(positions))
        binding.bind_output("logits", "cpu")
        for past, value in values.items():
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(past.replace("past_key_values", "present"), value)
        session.run_with_iobinding(binding)
        logits: np.ndarray = binding.get_outputs()[0].numpy()
        return logits

    aligned = np.stack([np.roll(row, n - width) for row, n in zip(ids, lengths, strict=True)])  # left aligned
    logits = run(aligned, lengths, np.tile(np.arange(width), (rows, 1)))
    step_logits = [logits[np.arange(rows), lengths - 1]]
    for column in range(steps.shape[1]):
        step_logits.append(run(steps[:, column : column + 1], lengths + column + 1, (lengths + column)[:, None])[:, -1])
        written = buffers["past_key_values.0.key"][np.arange(rows), :, lengths + column]
        assert np.abs(written).sum(axis=-1).all()  # this step's keys, in place
    assert buffers["past_key_values.0.key"].shape[1] == kv_heads
    full = torch.cat([inputs["input_ids"], torch.as_tensor(steps)], dim=1)
    full_mask = torch.cat([inputs["attention_mask"], torch.ones(rows, steps.shape[1], dtype=torch.long)], dim=1)
    reference = hf_parity.fp16_rounded(hf_parity.load_hf_model(folder, family))
    with torch.no_grad():
        theirs = reference(input_ids=full, attention_mask=full_mask,
                           position_ids=(full_mask.cumsum(1) - 1).clamp(min=0)).logits
    expected = theirs[:, ids.shape[1] - 1 :].numpy()  # the prompt's last position, then each step's
    assert np.abs(np.stack(step_logits, axis=1) - expected).max() < 1e-4


def test_tokenizer_json_encodes_like_the_checkpoints_tokenizer(hf_decoder_imports: Path) -> None:
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(hf_decoder_imports / "checkpoints" / "llama"))
    ours = Tokenizer.from_file(str(hf_decoder_imports / "artifacts" / "llama" / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text


def test_artifact_states_kv_heads_end_tokens_and_defaults(hf_decoder_imports: Path) -> None:
    config = json.loads((hf_decoder_imports / "artifacts" / "llama" / "config.json").read_text())
    assert config["dims"]["n_kv_heads"] == 2 and config["dims"]["n_heads"] == 4
    assert config["special_tokens"] == {"pad": 1, "bos": 0, "eos": 1}
    assert config["eos_token_ids"] == LLAMA_GENERATION["eos_token_id"]
    assert config["generation_defaults"] == {"temperature": 0.7, "top_p": 0.9, "top_k": 20,
                                             "repetition_penalty": 1.05, "max_new_tokens": 12}
    card = json.loads((hf_decoder_imports / "artifacts" / "llama" / "card.json").read_text())
    assert card["parity"]["torch_fp32_max_abs_diff"] < 1e-5
    assert card["parity"]["onnx_vs_fp16_rounded_max_abs_diff"] < 1e-4
    mistral = json.loads((hf_decoder_imports / "artifacts" / "mistral" / "config.json").read_text())
    assert mistral["dims"]["n_kv_heads"] == 1 and "eos_token_ids" not in mistral


def test_our_generator_keeps_layer_norm_and_learned_positions() -> None:
    """The Llama options are off by default: our own GPT has no rotary table, no RMSNorm, no gated FFN,
    and the same parameter names as before."""
    model = Generator(GeneratorConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                      learned_positions=True))
    assert model.rotary is None and model.pos is not None
    assert not any(isinstance(m, RMSNorm) for m in model.modules())
    assert {"pos.table.weight", "blocks.0.ff.fc1.weight", "blocks.0.ln_self.bias"} <= set(model.state_dict())


# --- config variants and refusals --------------------------------------------------------------------------


def edited_copy(hf_decoder_imports: Path, name: str, tmp_path: Path, **changes: object) -> Path:
    folder = tmp_path / name
    shutil.copytree(hf_decoder_imports / "checkpoints" / name, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))
    return folder


def test_hub_style_rope_theta_and_rope_scaling_are_read(hf_decoder_imports: Path, tmp_path: Path) -> None:
    """Hub checkpoints state rope_theta and rope_scaling at the top level (transformers 5 saves rope_parameters)."""
    original = hf_decoder_imports / "checkpoints" / "llama-linear"
    params = read_hf_config(original)["rope_parameters"]
    folder = edited_copy(hf_decoder_imports, "llama-linear", tmp_path, rope_parameters=None,
                         rope_theta=params["rope_theta"], rope_scaling={"type": "linear", "factor": params["factor"]})
    family, model, specials = imported(folder)
    assert model.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    inputs = batch(original, family, specials)
    reference = hf_parity.load_hf_model(original, family)
    ours, theirs = hf_parity.ours_logits(model, family, inputs), hf_parity.hf_logits(reference, family, inputs)
    assert hf_parity.max_abs_diff(ours, theirs, inputs["attention_mask"].bool()) < 1e-5


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}},
     r"llama: rope_scaling type 'yarn' is not supported \(supported: default, linear, llama3\)"),
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     r"rope_scaling type 'dynamic' is not supported"),
    ("mistral", {"sliding_window": 16}, r"mistral: sliding-window attention \(sliding_window=16 < "
                                        r"max_position_embeddings=64\) is not supported"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8}, r"qwen2: sliding-window attention"),
    ("llama", {"head_dim": 16}, r"llama: head_dim=16 .* is not supported"),
])
def test_unsupported_options_are_refused_by_name(hf_decoder_imports: Path, tmp_path: Path, name: str,
                                                 changes: dict[str, object], message: str) -> None:
    folder = edited_copy(hf_decoder_imports, name, tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message):
        imported(folder)


def test_a_window_as_long_as_the_context_is_no_window(hf_decoder_imports: Path, tmp_path: Path) -> None:
    folder = edited_copy(hf_decoder_imports, "mistral", tmp_path, sliding_window=64)
    assert imported(folder)[1].config.n_kv_heads == 1


@pytest.mark.parametrize(("setting", "message"), [
    ({"bad_words_ids": [[5], [6, 7]]},
     r"generation_config.json: bad_words_ids with multi-token sequences \(\[\[6, 7\]\]\) is not supported"),
    ({"num_beams": 4}, r"num_beams=4 is not supported"),
    ({"no_repeat_ngram_size": 3}, r"no_repeat_ngram_size=3 is not supported"),
    ({"max_length": 20}, r"max_length=20 below the model's 64 positions is not supported"),
    ({"eos_token_id": "x"}, r"eos_token_id must be a token id or a list of token ids"),
])
def test_unsupported_generation_settings_are_refused_by_name(hf_decoder_imports: Path, tmp_path: Path,
                                                             setting: dict[str, object], message: str) -> None:
    folder = edited_copy(hf_decoder_imports, "llama", tmp_path)
    (folder / "generation_config.json").write_text(json.dumps(LLAMA_GENERATION | setting))
    with pytest.raises(CheckpointError, match=message):
        imported(folder)


def test_settings_that_do_not_change_tokens_are_accepted(hf_decoder_imports: Path, tmp_path: Path) -> None:
    folder = edited_copy(hf_decoder_imports, "qwen2", tmp_path)
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 1, "use_cache": True, "num_beams": 1, "max_length": 64, "transformers_version": "5"}))
    config = imported(folder)[1].config
    assert config.eos_token_ids == [] and config.generation_defaults == {} and config.bad_words_ids == []


def test_single_token_bad_words_are_kept(hf_decoder_imports: Path, tmp_path: Path) -> None:
    folder = edited_copy(hf_decoder_imports, "qwen2", tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "bad_words_ids": [[5], [9]]}))
    assert imported(folder)[1].config.bad_words_ids == [[5], [9]]
