"""The contract module (contract/) against what the exporter writes and what the runtime feeds:
graph names, the model-kind registry, and the generator's optional ``logits_to_keep`` input."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.kinds import DECODER, KINDS, TASKS
from contract.names import LOGITS_TO_KEEP, PAST, PRESENT, TOP_IDS, TOP_K, TOP_LOGPROBS, kv_names
from service.engine.cache.appended import KVCache
from service.runtime.artifact import ArtifactError, load_artifact
from service.runtime.checks import check_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions

CONTRACT = Path(__file__).resolve().parents[2] / "service" / "contract"
OPTIONS = RuntimeOptions(device="cpu", intra_op_threads=1)


def test_the_contract_imports_only_the_standard_library_and_itself() -> None:
    """model/ (with torch) and the server image (without) both import it."""
    for path in CONTRACT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                allowed = name.startswith("contract") or name.split(".")[0] in sys.stdlib_module_names
                assert allowed, (path, name)


def test_exported_graphs_carry_the_contract_names_in_order(tiny_artifacts: Path) -> None:
    for kind in KINDS.values():
        config = json.loads((tiny_artifacts / kind.name / "config.json").read_text())
        assert (config["task"], config["architecture"]) == (kind.task.name, kind.task.architecture)
        assert list(config["graphs"]) == list(kind.task.roles)
        for role, graph in config["graphs"].items():
            io = kind.task.graph_io(role, config["dims"], logits_to_keep=True, top_k=True)
            assert [i["name"] for i in graph["inputs"]] == [*io.inputs, *io.optional_inputs], (kind.name, role)
            assert [o["name"] for o in graph["outputs"]] == list(io.all_outputs), (kind.name, role)
            assert [i["name"] for i in graph["inputs"] if "default" in i] == list(io.optional_inputs)


def test_every_task_has_one_kind_and_distinct_roles() -> None:
    # Embedders are imported only (sentence-transformers and bare encoders): no kind of our own trains one.
    assert sorted(k.task.name for k in KINDS.values()) == sorted(set(TASKS) - {"embedding"})
    for task in TASKS.values():
        assert len(set(task.roles)) == len(task.roles) and task.layer_dims
    assert TASKS["generation"].graph_io(DECODER, {"n_layers": 2}, True).optional_inputs == (LOGITS_TO_KEEP,)
    dims = {"n_encoder_layers": 1, "n_decoder_layers": 2}
    assert TASKS["translation"].graph_io(DECODER, dims, True).optional_inputs == ()
    translator = TASKS["translation"].graph_io(DECODER, dims, top_k=True)
    assert translator.optional_inputs == (TOP_K,) and translator.outputs[-2:] == (TOP_LOGPROBS, TOP_IDS)


def _prefill_feeds(layers: int, heads: int, d_head: int) -> dict[str, np.ndarray]:
    cache = KVCache.empty(2, layers, heads, d_head)
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=np.int64)
    return {"input_ids": np.array([[0, 5, 6, 7], [8, 9, 10, 11]]), **cache.feeds(mask)}


@pytest.mark.parametrize("io_binding", [False, True])
def test_the_generator_session_keeps_the_last_logits_only(tiny_artifacts: Path, io_binding: bool) -> None:
    artifact = load_artifact(tiny_artifacts / "generator")
    assert artifact.graphs[DECODER].keeps_last_logits
    session = GraphSession("generator", artifact.graphs[DECODER], RuntimeOptions(device="cpu", io_binding=io_binding))
    assert set(session.last_logits_only) == {LOGITS_TO_KEEP}
    feeds = _prefill_feeds(artifact.n_decoder_layers, artifact.n_heads, artifact.d_head)
    present = kv_names(PRESENT, artifact.n_decoder_layers)
    every = session.run(feeds, ["logits", *present])
    last = session.run(feeds | session.last_logits_only, ["logits", *present])
    assert every["logits"].shape[1] == 4 and last["logits"].shape[1] == 1
    np.testing.assert_allclose(last["logits"][:, 0], every["logits"][:, -1], atol=1e-5)
    for name in present:
        np.testing.assert_array_equal(last[name], every[name])


def test_the_int8_generator_passes_the_start_up_checks(tiny_artifacts: Path) -> None:
    """Its logits_to_keep = 1 logits are close to, not equal to, the last row of k = 0 (dynamic activation
    scales over the positions present): the probe checks the shapes there."""
    artifact = load_artifact(tiny_artifacts / "generator")
    session = GraphSession("generator", artifact.graphs[DECODER], RuntimeOptions(device="cpu", quantization="int8"))
    assert session.quantization == "int8" and session.last_logits_only
    check_artifact(artifact, {DECODER: session}, artifact.load_tokenizer(), 64)


def _without_logits_to_keep(tiny_artifacts: Path, tmp_path: Path) -> Path:
    """The tiny generator as an older export's config.json describes it (no optional input listed)."""
    folder = tmp_path / "generator"
    shutil.copytree(tiny_artifacts / "generator", folder)
    config = json.loads((folder / "config.json").read_text())
    graph = config["graphs"][DECODER]
    graph["inputs"] = [i for i in graph["inputs"] if i["name"] != LOGITS_TO_KEEP]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_graph_without_logits_to_keep_is_served_with_all_positions(tiny_artifacts: Path, tmp_path: Path) -> None:
    artifact = load_artifact(_without_logits_to_keep(tiny_artifacts, tmp_path))
    assert not artifact.graphs[DECODER].keeps_last_logits
    session = GraphSession("generator", artifact.graphs[DECODER], OPTIONS)
    assert session.last_logits_only == {}
    check_artifact(artifact, {DECODER: session}, artifact.load_tokenizer(), 64)


@pytest.mark.parametrize("change", ["no default", "default on a required input"])
def test_start_up_checks_refuse_a_wrong_optional_input(tiny_artifacts: Path, tmp_path: Path, change: str) -> None:
    folder = tmp_path / "generator"
    shutil.copytree(tiny_artifacts / "generator", folder)
    config = json.loads((folder / "config.json").read_text())
    for tensor in config["graphs"][DECODER]["inputs"]:
        if change == "no default" and tensor["name"] == LOGITS_TO_KEEP:
            del tensor["default"]
        if change == "default on a required input" and tensor["name"] == "position_ids":
            tensor["default"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    artifact = load_artifact(folder)
    session = GraphSession("generator", artifact.graphs[DECODER], OPTIONS)
    with pytest.raises(ArtifactError, match="default") as failed:
        check_artifact(artifact, {DECODER: session}, artifact.load_tokenizer(), 64)
    assert str(failed.value).startswith(str(folder / "config.json"))


def test_old_and_new_generator_graphs_give_the_same_next_token_logits(tmp_path: Path) -> None:
    """The same tiny weights exported with and without logits_to_keep: the engine's prefill and a decode
    step return the same last-position logits from both graphs."""
    pytest.importorskip("torch")
    import functools

    from model.export import graphs as export
    from model.export.tiny import build_tiny_model
    from model.kinds import MODEL_KINDS

    folders = {}
    for keep in (True, False):
        model, tokenizer = build_tiny_model("generator")
        tokenizer.save(str(tmp_path / "tokenizer.json"))
        specs = functools.partial(export.generator_specs, logits_to_keep=keep)
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(MODEL_KINDS, "generator", dataclasses.replace(MODEL_KINDS["generator"], graphs=specs))
            export.export_model("generator", model, tmp_path / "tokenizer.json", tmp_path / str(keep), int8=False)
        folders[keep] = load_artifact(tmp_path / str(keep))
    results = {}
    for keep, artifact in folders.items():
        session = GraphSession("generator", artifact.graphs[DECODER], OPTIONS)
        assert bool(session.last_logits_only) == keep
        feeds = _prefill_feeds(artifact.n_decoder_layers, artifact.n_heads, artifact.d_head)
        present = kv_names(PRESENT, artifact.n_decoder_layers)
        out = session.run(feeds | session.last_logits_only, ["logits", *present])
        step = {"input_ids": np.array([[3], [4]]), "attention_mask": np.ones((2, 5), np.int64),
                "position_ids": np.array([[3], [4]]), **{n.replace(PRESENT, PAST, 1): out[n] for n in present}}
        after = session.run(step | session.last_logits_only, ["logits"])["logits"]
        results[keep] = (out["logits"][:, -1], after[:, -1])
    for new, old in zip(results[True], results[False], strict=True):
        np.testing.assert_allclose(new, old, atol=1e-5)


def test_an_artifact_without_n_kv_heads_caches_every_head(tiny_artifacts: Path) -> None:
    artifact = load_artifact(tiny_artifacts / "generator")
    assert "n_kv_heads" not in artifact.dims and artifact.n_kv_heads == artifact.n_heads


@pytest.mark.parametrize(("kv_heads", "message"), [
    (3, r"dims.n_kv_heads must be a positive integer dividing dims.n_heads"),
    (4, r"n_kv_heads"),  # the graph's cache has 2 heads
    (None, r"n_heads|n_kv_heads"),  # absent: n_heads (4) is what config.json then claims
])
def test_n_kv_heads_must_be_the_graphs(hf_decoder_imports: Path, tmp_path: Path, kv_heads: int | None,
                                       message: str) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(hf_decoder_imports / "artifacts" / "llama", folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["dims"]["n_kv_heads"] == 2
    if kv_heads is None:
        del config["dims"]["n_kv_heads"]
    else:
        config["dims"]["n_kv_heads"] = kv_heads
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match=message):
        artifact = load_artifact(folder)
        session = GraphSession("llama", artifact.graphs[DECODER], OPTIONS)
        check_artifact(artifact, {DECODER: session}, artifact.load_tokenizer(), 64)


@pytest.mark.parametrize("defaults", [{"top_p": 0}, {"repetition_penalty": 0.0}, {"temperature": "hot"},
                                      {"top_k": 2.5}, {"max_new_tokens": 0}, {"temperature": True}])
def test_generation_defaults_outside_what_a_request_may_state_are_refused(defaults: dict[str, Any]) -> None:
    from service.runtime.artifact import _generation_defaults

    with pytest.raises(ArtifactError, match=f"generation_defaults.{next(iter(defaults))}"):
        _generation_defaults(defaults, "config.json")
    assert _generation_defaults({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 12},
                                "config.json")["top_k"] == 20
