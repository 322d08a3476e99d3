import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from service.runtime.artifact import ArtifactError, load_artifact
from service.runtime.sessions import (
    ALLOW_SPINNING,
    CPU,
    FORCE_SPINNING_STOP,
    GraphSession,
    RuntimeOptions,
    artifact_sessions,
    leaves_a_core,
)


def test_cuda_request_falls_back_to_cpu_and_says_so(tiny_artifacts: Path, caplog: pytest.LogCaptureFixture) -> None:
    artifact = load_artifact(tiny_artifacts / "classifier")
    with caplog.at_level(logging.WARNING):
        session = GraphSession(
            "classifier", artifact.graphs["encoder"], RuntimeOptions(device="cuda", intra_op_threads=1)
        )
    assert session.provider == session.session.get_providers()[0]
    if session.provider == CPU:  # this machine has no working CUDA
        assert "CPU" in caplog.text and session.device == "cpu"


def test_io_binding_path_matches_plain_run(tiny_artifacts: Path) -> None:
    """The CUDA path (IOBinding, outputs kept as OrtValues and fed back) exercised on CPU."""
    artifact = load_artifact(tiny_artifacts / "generator")
    spec = artifact.graphs["decoder"]
    plain = GraphSession("generator", spec, RuntimeOptions(device="cpu", intra_op_threads=1))
    bound = GraphSession("generator", spec, RuntimeOptions(device="cpu", intra_op_threads=1, io_binding=True))
    L, H, Dh = artifact.n_decoder_layers, artifact.n_heads, artifact.d_head
    present = [f"present.{i}.{p}" for i in range(L) for p in ("key", "value")]
    past_names = [f"past_key_values.{i}.{p}" for i in range(L) for p in ("key", "value")]
    results = []
    for session in (plain, bound):
        feeds = {
            "input_ids": np.array([[5, 6, 7]]),
            "attention_mask": np.ones((1, 3), np.int64),
            "position_ids": np.arange(3)[None],
        }
        feeds |= {n: np.zeros((1, H, 0, Dh), np.float32) for n in past_names}
        out = session.run(feeds, ["logits", *present], keep=present)
        step = {
            "input_ids": np.array([[8]]),
            "attention_mask": np.ones((1, 4), np.int64),
            "position_ids": np.array([[3]]),
        }
        step |= dict(zip(past_names, (out[n] for n in present), strict=True))  # fed back as they came
        results.append(session.run(step, ["logits"])["logits"])
    np.testing.assert_allclose(results[0], results[1], atol=1e-6)


def test_broken_config_names_the_problem(tiny_artifacts: Path, tmp_path: Path) -> None:
    folder = tmp_path / "generator"
    shutil.copytree(tiny_artifacts / "generator", folder)
    config = json.loads((folder / "config.json").read_text())
    config["graphs"]["decoder"]["inputs"] = [
        i for i in config["graphs"]["decoder"]["inputs"] if i["name"] != "position_ids"
    ]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match="position_ids"):
        load_artifact(folder)
    config["format_version"] = 99
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match="format_version"):
        load_artifact(folder)


def test_only_the_graph_run_most_spins_between_runs(tiny_artifacts: Path) -> None:
    """The translator's encoder must not spin-wait beside its decoder; a lone graph (the classifier) does."""

    def spins(session: GraphSession) -> bool:  # ORT's own options; an unset entry (ORT's default: spin) raises
        try:
            entry: str = session.session.get_session_options().get_session_config_entry(ALLOW_SPINNING)
        except RuntimeError:
            return True
        return entry != "0"

    options = RuntimeOptions(device="cpu", intra_op_threads=2, spin_between_runs=True)
    translator = artifact_sessions("translator", load_artifact(tiny_artifacts / "translator").graphs, options)
    assert {role: spins(s) for role, s in translator.items()} == {"encoder": False, "decoder": True}
    classifier_graphs = load_artifact(tiny_artifacts / "classifier").graphs
    (classifier,) = artifact_sessions("classifier", classifier_graphs, options).values()
    assert spins(classifier)


def config_entry(session: ort.InferenceSession, key: str) -> str | None:
    try:
        value: str = session.get_session_options().get_session_config_entry(key)
    except RuntimeError:  # unset
        return None
    return value


def test_without_spinning_between_runs_every_graph_parks_as_a_run_returns(tiny_artifacts: Path) -> None:
    options = RuntimeOptions(device="cpu", intra_op_threads=2, spin_between_runs=False)
    translator = artifact_sessions("translator", load_artifact(tiny_artifacts / "translator").graphs, options)
    classifier = artifact_sessions("classifier", load_artifact(tiny_artifacts / "classifier").graphs, options)
    for session in [*translator.values(), *classifier.values()]:
        assert config_entry(session.session, FORCE_SPINNING_STOP) == "1"
        assert config_entry(session.session, ALLOW_SPINNING) is None  # threads still spin within a run


@pytest.mark.parametrize("spin", [False, True])
async def test_the_setting_reaches_every_session_the_engine_opens(serving: Any, spin: bool) -> None:
    async with serving(spin_between_runs=spin, intra_op_threads=2) as s:
        opened = [
            inner
            for info in s.engine.models.values()
            for graph in info.sessions.values()
            for inner in (graph.session, graph.busy_session)
            if inner is not None
        ]
        assert any(
            graph.busy_session is not None for info in s.engine.models.values() for graph in info.sessions.values()
        )
        assert {config_entry(inner, FORCE_SPINNING_STOP) for inner in opened} == ({None} if spin else {"1"})


@pytest.mark.parametrize(
    ("threads", "busy", "expected"),
    [(2, None, 1), (4, None, 3), (1, None, None), (4, 2, 2), (2, 2, None), (2, 3, None)],
)
def test_busy_threads_leave_the_event_loop_a_core(threads: int, busy: int | None, expected: int | None) -> None:
    options = RuntimeOptions(intra_op_threads=threads, busy_intra_op_threads=busy)
    assert options.busy_threads() == expected


def test_only_a_one_step_model_gets_a_busy_session(tiny_artifacts: Path) -> None:
    options = RuntimeOptions(device="cpu", intra_op_threads=2)
    classifier = artifact_sessions("classifier", load_artifact(tiny_artifacts / "classifier").graphs, options)
    translator = artifact_sessions("translator", load_artifact(tiny_artifacts / "translator").graphs, options)
    assert classifier["encoder"].busy_session is not None
    assert all(s.busy_session is None for s in translator.values())
    one_thread = artifact_sessions(
        "classifier",
        load_artifact(tiny_artifacts / "classifier").graphs,
        RuntimeOptions(device="cpu", intra_op_threads=1),
    )
    assert one_thread["encoder"].busy_session is None  # nothing to leave: no second session


def test_only_a_small_encoder_leaves_a_core(tiny_artifacts: Path) -> None:
    """MiniLM-sized encoders run multi-request batches on every thread (their run outweighs the event
    loop's work); our small classifier's leave one to it."""
    assert leaves_a_core({"n_layers": 4, "d_model": 256})  # our classifier
    assert not leaves_a_core({"n_layers": 6, "d_model": 384})  # all-MiniLM-L6-v2
    artifact = load_artifact(tiny_artifacts / "classifier")
    options = RuntimeOptions(device="cpu", intra_op_threads=2)
    large = {**artifact.dims, "n_layers": 6, "d_model": 384}
    assert artifact_sessions("classifier", artifact.graphs, options, dims=artifact.dims)["encoder"].busy_session
    assert artifact_sessions("classifier", artifact.graphs, options, dims=large)["encoder"].busy_session is None


def test_busy_session_computes_the_same_logits(tiny_artifacts: Path) -> None:
    session = GraphSession(
        "classifier",
        load_artifact(tiny_artifacts / "classifier").graphs["encoder"],
        RuntimeOptions(device="cpu", intra_op_threads=2),
        busy_session=True,
    )
    ids = np.array([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0]])
    feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": (ids > 0).astype(np.int64)}
    wide, busy = (session.run(feeds, ["logits"], busy=b)["logits"] for b in (False, True))
    np.testing.assert_allclose(wide, busy, atol=1e-6)
