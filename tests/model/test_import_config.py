"""The importer's checks that need no ``transformers`` (the fast lane; tests/model/test_hf_config_checks.py runs
them on a checkpoint of every family): config.json that is no JSON object, weights that are no weights, the
sizes check on listings of tensor shapes named as the checkpoints name them, ``--help`` listing every family,
and the card naming the checkpoint imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from model.families import FAMILIES
from model.families.base import CheckpointError
from model.families.dims import MAX_COMPUTED_POSITIONS, Shapes, check_config
from model.importing.hf_artifact import checkpoint_origin, import_card
from model.importing.hf_import import Imported
from scripts import import_checkpoint as cli

# GPT-2 and Llama as their checkpoints name the tensors the check reads (the base model's prefix stripped).
GPT2 = {"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64}
GPT2_SHAPES: Shapes = {"wte.weight": (100, 32), "wpe.weight": (64, 32), "h.0.mlp.c_fc.weight": (32, 128),
                       "h.1.mlp.c_fc.weight": (32, 128)}
LLAMA = {"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 64, "num_hidden_layers": 1, "max_position_embeddings": 2048}
LLAMA_SHAPES: Shapes = {"embed_tokens.weight": (100, 32), "layers.0.mlp.gate_proj.weight": (64, 32),
                        "layers.0.self_attn.k_proj.weight": (16, 32), "lm_head.weight": (100, 32)}
WHERE = "ckpt/config.json"


def refused(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main([str(folder), "--out", str(folder.parent / "out")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert not (folder.parent / "out").exists()
    return lines[0]


@pytest.mark.parametrize(("text", "says"), [("{", "not valid JSON"), ("[1, 2]", "a JSON object is required"),
                                            (b"\xff\xfe", "not valid JSON")])
def test_config_json_that_is_no_object(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes,
                                       says: str) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert refused(folder, capsys).startswith(f"error: {path}: {says}")


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_weights_that_are_no_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2))
    (folder / name).write_bytes(b"\x00" * 7 + b"not a tensor file")
    assert refused(folder, capsys).startswith(f"error: {folder / name}: unreadable weights")


def test_sizes_the_weights_hold_pass() -> None:
    assert check_config(FAMILIES["gpt2"].dims, GPT2, GPT2_SHAPES, WHERE) == (GPT2, [])
    assert check_config(FAMILIES["llama"].dims, LLAMA, LLAMA_SHAPES, WHERE) == (LLAMA, [])


@pytest.mark.parametrize(("change", "says"), [
    ({"n_head": 0}, "n_head=0 must be a positive integer"),
    ({"n_head": 5}, "n_head=5 must divide n_embd=32"),
    ({"n_head": True}, "n_head=True must be a positive integer"),
    ({"n_embd": 2**20}, f"n_embd={2**20} but wte.weight is 100 x 32"),
    ({"vocab_size": 2**40}, f"vocab_size={2**40} but wte.weight holds 100 tokens"),
    ({"n_layer": 3}, "n_layer=3 but the weights hold 2 layers (h.N.*)"),
    ({"n_inner": 2**30}, f"n_inner={2**30} but h.0.mlp.c_fc.weight holds 128"),
    ({"n_positions": 10**12}, f"n_positions={10**12} but wpe.weight holds 64"),
    ({"n_positions": 32}, "n_positions=32 but wpe.weight holds 64"),
    ({"n_positions": None}, "n_positions is required"),
])
def test_gpt2_sizes_follow_the_weights(change: dict[str, Any], says: str) -> None:
    with pytest.raises(CheckpointError) as error:
        check_config(FAMILIES["gpt2"].dims, GPT2 | change, GPT2_SHAPES, WHERE)
    assert str(error.value).startswith(f"{WHERE}: {says}")


@pytest.mark.parametrize(("change", "says"), [
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 must divide num_attention_heads=4"),
    ({"num_key_value_heads": 1}, "num_key_value_heads=1 but layers.0.self_attn.k_proj.weight has 16 rows"),
    ({"vocab_size": 2**40}, f"vocab_size={2**40} but embed_tokens.weight holds 100 tokens"),
    ({"max_position_embeddings": 1e12}, "max_position_embeddings=1000000000000.0 must be a positive integer"),
])
def test_llama_sizes_follow_the_weights(change: dict[str, Any], says: str) -> None:
    with pytest.raises(CheckpointError) as error:
        check_config(FAMILIES["llama"].dims, LLAMA | change, LLAMA_SHAPES, WHERE)
    assert str(error.value).startswith(f"{WHERE}: {says}")


def test_a_rotary_position_limit_is_capped_and_said() -> None:
    """Rotary positions have no table: config.json is the only source, so a limit past the cap is lowered."""
    stated = LLAMA | {"max_position_embeddings": 10**12}
    hf, notes = check_config(FAMILIES["llama"].dims, stated, LLAMA_SHAPES, WHERE)
    assert hf == LLAMA | {"max_position_embeddings": MAX_COMPUTED_POSITIONS}
    assert stated["max_position_embeddings"] == 10**12  # the caller's dict is left as it was
    assert len(notes) == 1 and notes[0].startswith(f"max_position_embeddings={10**12} lowered to 131072")
    at_cap = LLAMA | {"max_position_embeddings": MAX_COMPUTED_POSITIONS}
    assert check_config(FAMILIES["llama"].dims, at_cap, LLAMA_SHAPES, WHERE) == (at_cap, [])


def test_help_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out.split("families (config.json model_type, transformers class):")[1]
    rows = [line.split() for line in listed.strip().splitlines()]
    assert rows == [[name, family.reference_class(True)] for name, family in FAMILIES.items()]
    assert {row[0] for row in rows} >= {"bert", "gpt2", "llama", "bart", "t5", "m2m_100"}


def test_the_card_names_the_checkpoint_imported(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2's config.json says _name_or_path nreimers/MiniLM-L6-H384-uncased, its base model."""
    snapshot = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / "c9745ed1"
    snapshot.mkdir(parents=True)
    assert checkpoint_origin(snapshot) == "sentence-transformers/all-MiniLM-L6-v2"
    assert checkpoint_origin(tmp_path / "hub" / "models--gpt2" / "snapshots" / "x") == "gpt2"
    folder = tmp_path / "all-MiniLM-L6-v2"
    folder.mkdir()
    hf = {"_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "model_type": "bert", "architectures": ["BertModel"]}
    result = Imported("embedder", "bert", nn.Linear(2, 2), hf, {})
    card = import_card("embedder", result, folder, "apache-2.0", "python -m scripts.import_checkpoint", {})
    assert card["source"]["origin"] == "all-MiniLM-L6-v2"
