"""config.json sizes the weights do not hold: ``python -m scripts.import_checkpoint`` answers one line naming the
field and exits 2, before it reads the tokenizer or the weights and before any model is built (each test fails if
one is); a computed position limit past the cap imports lowered to it, and the artifact serves that limit.

One tiny checkpoint per family the importer supports, built by ``transformers`` (weights and config.json only: the
check comes before the tokenizer)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from model.families import FAMILIES
from model.families.dims import MAX_COMPUTED_POSITIONS
from model.importing.hf_import import checked_config
from scripts import import_checkpoint as cli

D, HEADS, FF, LAYERS, POSITIONS, VOCAB = 32, 4, 64, 2, 64, 100
ENCODER = {"vocab_size": VOCAB, "hidden_size": D, "num_attention_heads": HEADS, "intermediate_size": FF,
           "num_hidden_layers": LAYERS}
SEQ2SEQ = {"vocab_size": VOCAB, "d_model": D, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
           "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS, "encoder_ffn_dim": FF,
           "decoder_ffn_dim": FF, "max_position_embeddings": POSITIONS, "pad_token_id": 1,
           "decoder_start_token_id": 2, "eos_token_id": 2}
DECODER = {**ENCODER, "num_key_value_heads": 2, "max_position_embeddings": POSITIONS}
# family -> (transformers model class, config class, options)
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertForSequenceClassification", "BertConfig", {**ENCODER, "max_position_embeddings": POSITIONS}),
    "roberta": ("RobertaForSequenceClassification", "RobertaConfig",
                {**ENCODER, "max_position_embeddings": POSITIONS + 2, "pad_token_id": 1, "type_vocab_size": 1}),
    "xlm-roberta": ("XLMRobertaForSequenceClassification", "XLMRobertaConfig",
                    {**ENCODER, "max_position_embeddings": POSITIONS + 2, "pad_token_id": 1, "type_vocab_size": 1}),
    "distilbert": ("DistilBertForSequenceClassification", "DistilBertConfig",
                   {"vocab_size": VOCAB, "dim": D, "n_heads": HEADS, "hidden_dim": FF, "n_layers": LAYERS,
                    "max_position_embeddings": POSITIONS}),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             {"vocab_size": VOCAB, "n_embd": D, "n_head": HEADS, "n_inner": FF, "n_layer": LAYERS,
              "n_positions": POSITIONS}),
    "llama": ("LlamaForCausalLM", "LlamaConfig", DECODER),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", DECODER),
    "mistral": ("MistralForCausalLM", "MistralConfig", DECODER),
    "marian": ("MarianMTModel", "MarianConfig", SEQ2SEQ),
    "bart": ("BartForConditionalGeneration", "BartConfig", SEQ2SEQ),
    "m2m_100": ("M2M100ForConditionalGeneration", "M2M100Config", SEQ2SEQ),
    "t5": ("T5ForConditionalGeneration", "T5Config",
           {"vocab_size": VOCAB, "d_model": D, "d_kv": D // HEADS, "d_ff": FF, "num_layers": LAYERS,
            "num_heads": HEADS, "n_positions": POSITIONS}),
}
# family -> its config.json names of: width, heads, layers, feed-forward width, position limit (as HF names them)
ENCODER_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                "max_position_embeddings")
SEQ2SEQ_KEYS = ("d_model", "encoder_attention_heads", "decoder_layers", "decoder_ffn_dim", "max_position_embeddings")
KEYS = {"bert": ENCODER_KEYS, "roberta": ENCODER_KEYS, "xlm-roberta": ENCODER_KEYS,
        "distilbert": ("dim", "n_heads", "n_layers", "hidden_dim", "max_position_embeddings"),
        "gpt2": ("n_embd", "n_head", "n_layer", "n_inner", "n_positions"),
        "llama": ENCODER_KEYS, "qwen2": ENCODER_KEYS, "mistral": ENCODER_KEYS,
        "marian": SEQ2SEQ_KEYS, "bart": SEQ2SEQ_KEYS, "m2m_100": SEQ2SEQ_KEYS,
        "t5": ("d_model", "num_heads", "num_layers", "d_ff", "n_positions")}
LEARNED_POSITIONS = {"bert", "roberta", "xlm-roberta", "distilbert", "gpt2", "bart"}
DELETE = object()
POSITIVE = "must be a positive integer"
# (what, an index into KEYS or the key itself, the bad value, what the line says after the key)
MUTATIONS: list[tuple[str, int | str, object, str]] = [
    ("huge width", 0, 2**20, f"={2**20} but "),  # terabytes of weights if the model were built
    ("string width", 0, "32", f"='32' {POSITIVE}"),
    ("no width", 0, DELETE, " is required"),
    ("zero heads", 1, 0, f"=0 {POSITIVE}"),
    ("heads not dividing the width", 1, 3, "=3 must divide"),
    ("huge vocabulary", "vocab_size", 2**40, f"={2**40} but "),
    ("layers the weights lack", 2, 10**6, f"={10**6} but the weights hold {LAYERS} layers"),
    ("negative layers", 2, -1, f"=-1 {POSITIVE}"),
    ("huge feed-forward", 3, 2**30, f"={2**30} but "),
    ("float position limit", 4, 1e12, f"=1000000000000.0 {POSITIVE}"),
    ("zero positions", 4, 0, f"=0 {POSITIVE}"),
]
# Sizes only some families have: (family, key, bad value, what the line says after the key).
FAMILY_MUTATIONS: list[tuple[str, str, object, str]] = [
    ("bert", "type_vocab_size", 2**40, f"={2**40} but embeddings.token_type_embeddings.weight holds 2"),
    ("bert", "id2label", {str(i): f"L{i}" for i in range(5)}, " gives 5 labels but classifier.weight holds 2"),
    ("distilbert", "id2label", ["a", "b"], " must be an object"),
    ("roberta", "pad_token_id", None, "=None must be a token id"),
    ("m2m_100", "pad_token_id", 2**40, f"={2**40} must be a token id below vocab_size={VOCAB}"),
    ("t5", "relative_attention_num_buckets", 2**40, f"={2**40} but "),
    ("t5", "d_kv", 0, f"=0 {POSITIVE}"),
    ("t5", "num_decoder_layers", 5, f"=5 but the weights hold {LAYERS} layers"),
    ("gpt2", "vocab_size", 50, "=50 but wte.weight holds 100 tokens"),
    ("llama", "head_dim", -8, f"=-8 {POSITIVE}"),
]


def test_every_family_is_covered() -> None:
    assert set(MODELS) == set(FAMILIES) == set(KEYS)


def build(family: str, folder: Path) -> Path:
    import transformers

    model_class, config_class, options = MODELS[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**options))
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config-checks")
    for family in MODELS:
        build(family, root / family)
    return root


@pytest.fixture
def no_model_built(monkeypatch: pytest.MonkeyPatch) -> None:
    block_building(monkeypatch)


def block_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a network, loading the weights or reading the tokenizer fails the test: the check comes first."""
    from model.families import shapes
    from model.importing import hf_artifact, hf_import

    def refuse(what: str) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            pytest.fail(f"{what} before the config was refused")

        return fail

    for name in ("Classifier", "Embedder", "Generator", "Translator"):
        monkeypatch.setattr(shapes, name, refuse(f"a {name} was built"))
    monkeypatch.setattr(hf_import, "read_weights", refuse("the weights were loaded"))
    monkeypatch.setattr(hf_artifact, "load_tokenizer", refuse("the tokenizer was read"))


def mutated(checkpoints: Path, family: str, tmp_path: Path, key: str, value: object) -> Path:
    folder = tmp_path / family
    shutil.copytree(checkpoints / family, folder)
    config = json.loads((folder / "config.json").read_text())
    if value is DELETE:
        config.pop(key, None)
    else:
        config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def refused(folder: Path, tmp_path: Path, key: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the importer's command line; asserts exit 2 and one line naming ``key``; returns the line."""
    out = tmp_path / "artifact"
    assert cli.main([str(folder), "--out", str(out), "--no-int8"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err + captured.out, captured.err
    assert lines[0].startswith(f"error: {folder}/config.json: {key}"), lines[0]
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize(("what", "field", "value", "says"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
@pytest.mark.usefixtures("no_model_built")
def test_a_size_the_weights_do_not_hold_is_one_line_naming_it(
        checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str, what: str,
        field: int | str, value: object, says: str) -> None:
    key = KEYS[family][field] if isinstance(field, int) else field
    line = refused(mutated(checkpoints, family, tmp_path, key, value), tmp_path, key, capsys)
    assert line.startswith(f"error: {tmp_path / family}/config.json: {key}{says}"), line


@pytest.mark.parametrize(("family", "key", "value", "says"), FAMILY_MUTATIONS,
                         ids=[f"{m[0]}-{m[1]}" for m in FAMILY_MUTATIONS])
@pytest.mark.usefixtures("no_model_built")
def test_the_sizes_of_one_family(checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str,
                                 key: str, value: object, says: str) -> None:
    line = refused(mutated(checkpoints, family, tmp_path, key, value), tmp_path, key, capsys)
    assert line.startswith(f"error: {tmp_path / family}/config.json: {key}{says}"), line


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize(("value", "message"), [(3, "must divide num_attention_heads=4"),
                                                (4, "but layers.0.self_attn.k_proj.weight has 16 rows"),
                                                (0, "must be a positive integer")])
@pytest.mark.usefixtures("no_model_built")
def test_key_value_heads_follow_the_key_projection(checkpoints: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], family: str, value: int,
                                                   message: str) -> None:
    folder = mutated(checkpoints, family, tmp_path, "num_key_value_heads", value)
    assert message in refused(folder, tmp_path, "num_key_value_heads", capsys)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_a_position_limit_past_the_weights(checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, family: str) -> None:
    """10**12 positions: refused where the weights hold a position table (its size is the limit); lowered to
    the cap, and said in the notes, where the positions are computed (rotary, sinusoids, relative buckets)."""
    key = KEYS[family][4]
    folder = mutated(checkpoints, family, tmp_path, key, 10**12)
    if family in LEARNED_POSITIONS:
        block_building(monkeypatch)
        line = refused(folder, tmp_path, key, capsys)
        assert f"={10**12} but " in line and f" holds {MODELS[family][2][key]} (shape " in line, line
        return
    hf, _, notes = checked_config(folder)
    assert hf[key] == MAX_COMPUTED_POSITIONS
    assert [note for note in notes if note.startswith(f"{key}={10**12} lowered to {MAX_COMPUTED_POSITIONS}")]


def test_a_rotary_position_limit_is_served_capped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The finding: max_position_embeddings 10**12 on a 64-position Llama. The import lowers it to the cap,
    the card says so, and the artifact the server loads serves that limit."""
    from service.runtime.artifact import load_artifact
    from tests.hf_checkpoints import build_decoder

    folder = build_decoder("llama", tmp_path / "llama")
    config = json.loads((folder / "config.json").read_text())
    changed = {"max_position_embeddings": 10**12, "_name_or_path": "someone/base-model"}
    (folder / "config.json").write_text(json.dumps(config | changed))
    out = tmp_path / "llama-capped"
    assert cli.main([str(folder), "--out", str(out), "--no-int8"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert load_artifact(out).max_positions == MAX_COMPUTED_POSITIONS
    card = json.loads((out / "card.json").read_text())
    assert any(f"lowered to {MAX_COMPUTED_POSITIONS}" in note for note in card["notes"]), card["notes"]
    assert card["source"]["origin"] == "llama"  # the checkpoint imported, not the one it was saved from
