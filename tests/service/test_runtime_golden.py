"""Start-up checks against golden.json (contract/golden.py): an artifact whose tokenizer, config or
graph differs from what its export recorded is refused with one line naming that file, where it would
otherwise load and answer wrongly. The tiny artifacts' exports record every section."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contract.golden import CONFIG, FILES, GOLDEN_FILE, TOKENIZER, read_golden
from service.engine.engine import Engine
from service.runtime.artifact import ArtifactError
from service.settings import Settings

Edit = Callable[[Path], None]


def _copy(tiny_artifacts: Path, tmp_path: Path, model: str) -> Path:
    folder = tmp_path / model
    shutil.copytree(tiny_artifacts / model, folder)
    return folder


def _edit_json(name: str, change: Callable[[dict[str, Any]], None]) -> Edit:
    def edit(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).write_text(json.dumps(data))

    return edit


def _tokenizer_of(other: str) -> Edit:
    def edit(folder: Path) -> None:
        shutil.copyfile(folder.parent.parent / "tiny" / other / "tokenizer.json", folder / "tokenizer.json")

    return edit


def _swap_vocab_of_sample(data: dict[str, Any]) -> None:
    """Two tokens of the sample texts trade ids: same size, same tokens, other ids."""
    vocab = data["model"]["vocab"]
    a, b = sorted((t for t in vocab if len(t) > 1 and vocab[t] > 10), key=vocab.get)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _drop_records(golden: dict[str, Any]) -> None:
    """golden.json as an export before its tokenizer, config and files records wrote it."""
    for section in (TOKENIZER, CONFIG, FILES):
        golden.pop(section)


def _set_special(**ids: int) -> Callable[[dict[str, Any]], None]:
    return lambda config: config["special_tokens"].update(ids)


def _load(make_settings: Callable[..., Settings], root: Path, model: str) -> None:
    Engine(make_settings(artifacts_dir=root, models=model)).load()


def _refusal(make_settings: Callable[..., Settings], root: Path, model: str) -> str:
    with pytest.raises(ArtifactError) as failed:
        _load(make_settings, root, model)
    message = str(failed.value)
    assert "\n" not in message
    return message


@pytest.fixture
def tiny_root(tiny_artifacts: Path, tmp_path: Path) -> Path:
    """The tiny artifacts under tmp_path/tiny (the source of swapped files); edited copies go in tmp_path/edited."""
    shutil.copytree(tiny_artifacts, tmp_path / "tiny")
    (tmp_path / "edited").mkdir()
    return tmp_path / "edited"


TOKENIZER_EDITS: list[tuple[str, str, Edit]] = [
    ("the generator's tokenizer, of the same size", "translator", _tokenizer_of("generator")),
    ("the translator's tokenizer, of the same size", "generator", _tokenizer_of("translator")),
    ("no post-processor (no end token)", "translator",
     _edit_json("tokenizer.json", lambda t: t.update(post_processor=None))),
    ("no normalizer (no lower-casing)", "classifier",
     _edit_json("tokenizer.json", lambda t: t.update(normalizer=None))),
    ("two tokens trade ids", "generator", _edit_json("tokenizer.json", _swap_vocab_of_sample)),
]


@pytest.mark.parametrize("case,model,edit", TOKENIZER_EDITS, ids=[c[0] for c in TOKENIZER_EDITS])
def test_a_tokenizer_that_is_not_the_exported_one_is_refused(
    make_settings: Callable[..., Settings], tiny_root: Path, case: str, model: str, edit: Edit
) -> None:
    folder = _copy(tiny_root.parent / "tiny", tiny_root, model)
    edit(folder)
    message = _refusal(make_settings, tiny_root, model)
    assert message.startswith(f"{folder / 'tokenizer.json'}: "), message


CONFIG_EDITS: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    ("bos and eos swapped", "translator", _set_special(bos=3, eos=2)),
    ("pad and unk swapped", "translator", _set_special(pad=1, unk=0)),
    ("eos is the pad token", "generator", _set_special(eos=0, bos=0)),
    ("cls and sep swapped", "classifier", _set_special(cls=3, sep=2)),
    ("labels reversed", "classifier", lambda c: c.update(labels=c["labels"][::-1])),
    ("max_positions smaller", "generator", lambda c: c.update(max_positions=c["max_positions"] // 2)),
    ("d_model changed", "generator", lambda c: c["dims"].update(d_model=c["dims"]["d_model"] * 2)),
]


@pytest.mark.parametrize("case,model,change", CONFIG_EDITS, ids=[c[0] for c in CONFIG_EDITS])
def test_a_config_that_is_not_the_exported_one_is_refused(
    make_settings: Callable[..., Settings], tiny_root: Path, case: str, model: str,
    change: Callable[[dict[str, Any]], None],
) -> None:
    folder = _copy(tiny_root.parent / "tiny", tiny_root, model)
    _edit_json("config.json", change)(folder)
    message = _refusal(make_settings, tiny_root, model)
    assert message.startswith(f"{folder / 'config.json'}: "), message


def _change_one_weight(folder: Path) -> None:
    """One value of the largest initializer (the embedding: a row few inputs read) made large."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    path = folder / "decoder.onnx"
    model = onnx.load(str(path))
    largest = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    values = numpy_helper.to_array(largest).copy()
    values.reshape(-1)[-1] = 1000.0
    largest.CopyFrom(numpy_helper.from_array(values, largest.name))
    onnx.save(model, str(path))


def test_a_graph_whose_bytes_changed_is_refused(make_settings: Callable[..., Settings], tiny_root: Path) -> None:
    folder = _copy(tiny_root.parent / "tiny", tiny_root, "generator")
    _change_one_weight(folder)
    message = _refusal(make_settings, tiny_root, "generator")
    assert message.startswith(f"{folder / 'decoder.onnx'}: its sha256 differs"), message


def test_graph_outputs_that_differ_from_the_record_are_refused(
    make_settings: Callable[..., Settings], tiny_root: Path
) -> None:
    """Without the files section (an older export), the recorded outputs still catch a changed graph."""
    folder = _copy(tiny_root.parent / "tiny", tiny_root, "translator")

    def other_outputs(golden: dict[str, Any]) -> None:
        del golden[FILES]
        golden["decoder"]["logits"]["head"][0] += 1.0

    _edit_json(GOLDEN_FILE, other_outputs)(folder)
    message = _refusal(make_settings, tiny_root, "translator")
    assert message.startswith(f"{folder / 'decoder.onnx'}: logits for golden.json's input"), message


def test_an_unreadable_golden_file_is_refused(make_settings: Callable[..., Settings], tiny_root: Path) -> None:
    folder = _copy(tiny_root.parent / "tiny", tiny_root, "classifier")
    (folder / GOLDEN_FILE).write_text("{")
    assert _refusal(make_settings, tiny_root, "classifier").startswith(f"{folder / GOLDEN_FILE}: ")


@pytest.mark.parametrize("model", ["translator", "generator", "classifier"])
def test_an_older_export_without_the_records_loads_with_a_warning(
    make_settings: Callable[..., Settings], tiny_root: Path, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _copy(tiny_root.parent / "tiny", tiny_root, model)
    _edit_json(GOLDEN_FILE, _drop_records)(folder)
    with caplog.at_level(logging.WARNING, logger="service.runtime.checks"):
        _load(make_settings, tiny_root, model)
    assert f"{GOLDEN_FILE} lacks tokenizer, config, files" in caplog.text


STRUCTURAL_EDITS: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    ("bos and eos swapped", "translator", _set_special(bos=3, eos=2), "special_tokens.eos is 2"),
    ("pad and unk swapped", "translator", _set_special(pad=1, unk=0), "special_tokens.unk is 0"),
    ("cls and sep swapped", "classifier", _set_special(cls=3, sep=2), "special_tokens.cls is 3"),
]


@pytest.mark.parametrize("case,model,change,says", STRUCTURAL_EDITS, ids=[c[0] for c in STRUCTURAL_EDITS])
def test_special_tokens_that_disagree_with_the_tokenizer_are_refused_without_records(
    make_settings: Callable[..., Settings], tiny_root: Path, case: str, model: str,
    change: Callable[[dict[str, Any]], None], says: str,
) -> None:
    """An older export (no golden records): the tokenizer's own unknown token and the framing the contract
    expects of its encodings (a translator's source ends with eos, a classifier's is cls ... sep)."""
    folder = _copy(tiny_root.parent / "tiny", tiny_root, model)
    (folder / GOLDEN_FILE).unlink()
    _edit_json("config.json", change)(folder)
    message = _refusal(make_settings, tiny_root, model)
    assert message.startswith(f"{folder / 'config.json'}: {says}, but {folder / 'tokenizer.json'} puts"), message


@pytest.mark.parametrize("model", ["translator", "generator", "classifier"])
def test_the_add_command_records_what_the_export_did(tiny_artifacts: Path, tmp_path: Path, model: str) -> None:
    """`python -m model.export.golden --add FOLDER` on an older export's golden.json writes the sections a fresh
    export writes, and leaves the graph outputs alone."""
    pytest.importorskip("onnxruntime")
    from model.export.golden import add_records

    folder = _copy(tiny_artifacts, tmp_path, model)
    exported = read_golden(folder)
    assert exported is not None and {TOKENIZER, CONFIG, FILES} <= set(exported)
    _edit_json(GOLDEN_FILE, _drop_records)(folder)
    add_records(folder)
    assert read_golden(folder) == exported


def test_recorded_outputs_allow_run_to_run_noise_and_nothing_more() -> None:
    import numpy as np

    from contract.golden import CPU_TOLERANCE, DEVICE_TOLERANCE, output_difference, summarize

    logits = np.random.default_rng(0).standard_normal((2, 4, 50)).astype(np.float32) * 3
    recorded = summarize(logits)
    assert output_difference(logits * 1.002, recorded, CPU_TOLERANCE) is None  # threads, fusions
    assert output_difference(logits * 1.03, recorded, CPU_TOLERANCE) is not None
    assert output_difference(logits * 1.03, recorded, DEVICE_TOLERANCE) is None  # another provider's kernels
    assert output_difference(np.roll(logits, 1), recorded, DEVICE_TOLERANCE) is not None  # another graph
    nan = logits.copy()
    nan[0, 0, 0] = np.nan
    assert output_difference(nan, recorded, DEVICE_TOLERANCE) is not None
    assert output_difference(np.roll(logits, 1), recorded, None) is None  # int8: the shape only
    assert output_difference(logits[:1], recorded, None) is not None


@pytest.mark.parametrize("section", [TOKENIZER, "decoder"])
def test_a_malformed_golden_section_is_named(
    make_settings: Callable[..., Settings], tiny_root: Path, section: str
) -> None:
    """Valid JSON, but not what the export writes: one line naming golden.json, not a traceback."""
    folder = _copy(tiny_root.parent / "tiny", tiny_root, "generator")

    def malform(golden: dict[str, Any]) -> None:
        if section == TOKENIZER:
            golden[section]["samples"][0].pop("ids")
        else:
            golden[section]["logits"] = {"head": "x"}

    _edit_json(GOLDEN_FILE, malform)(folder)
    message = _refusal(make_settings, tiny_root, "generator")
    assert message.startswith(f"{folder / GOLDEN_FILE}: its {section} section is malformed"), message
