"""The translator decoder's own scoring head (top_logprobs/top_ids for an input k): beam steps fetch it
instead of the logits, and every translation is the same as through the standalone head on the logits
(graphs exported without it, which still serve)."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import pytest

from contract.kinds import DECODER, ENCODER
from contract.names import LOGITS, TOP_IDS, TOP_K, TOP_LOGPROBS
from service.engine.metrics import Metrics
from service.engine.tasks.translation import decoding as translation
from service.engine.tasks.translation.decoding import TranslationModel, TranslationParams, TranslationSequence
from service.runtime.artifact import ArtifactError, load_artifact
from service.runtime.checks import check_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions

TEXTS = ["In the beginning God created the heavens.", "A dull story.", "Fellow citizens, café 東京!", "Hi"]
OPTIONS = RuntimeOptions(device="cpu", intra_op_threads=1)
MIXED = [  # in one batch: greedy rows beside beam rows, n-gram bans, n-best, a forced first token
    (TranslationParams(num_beams=1, max_new_tokens=12), None),
    (TranslationParams(num_beams=4, n_best=3, max_new_tokens=12, no_repeat_ngram_size=0), None),
    (TranslationParams(num_beams=3, n_best=2, max_new_tokens=12, no_repeat_ngram_size=1), None),
    (TranslationParams(num_beams=4, n_best=2, max_new_tokens=12), 9),
    (TranslationParams(num_beams=1, max_new_tokens=12), 9),
]
Answer = list[list[tuple[tuple[int, ...], float, float]]]


def open_model(folder: Path) -> TranslationModel:
    artifact = load_artifact(folder)
    encoder, decoder = (GraphSession(artifact.name, artifact.graphs[role], OPTIONS) for role in (ENCODER, DECODER))
    return TranslationModel(artifact.name, artifact, encoder, decoder, artifact.load_tokenizer(), Metrics())


def translate(model: TranslationModel, settings: Sequence[tuple[TranslationParams, int | None]]) -> Answer:
    """Every text under every setting, all in one batch, as the scheduler's worker drives it: token ids,
    score and logprob of each hypothesis."""
    sources = [e.ids for e in model.tokenizer.encode_batch(TEXTS)]
    sequences = [TranslationSequence(src, p, p.max_new_tokens or 12, forced) for p, forced in settings
                 for src in sources]
    emits, batch = model.prefill(list(sequences))
    while batch is not None and batch.rows:
        emits += batch.step()
    final = {id(e.sequence): e.event for e in emits if e.final}
    return [[(tuple(h.token_ids), h.score, h.logprob) for h in final[id(s)].hypotheses] for s in sequences]


def recording(model: TranslationModel) -> list[tuple[list[str], int | None]]:
    """Each decoder run's fetched outputs and the k it fed (None: not fed)."""
    calls: list[tuple[list[str], int | None]] = []
    run = model.decoder.run

    def recorded(feeds: dict[str, Any], outputs: list[str], **kwargs: Any) -> Any:
        calls.append((list(outputs), int(feeds[TOP_K][0]) if TOP_K in feeds else None))
        return run(feeds, outputs, **kwargs)

    setattr(model.decoder, "run", recorded)  # noqa: B010 (a stand-in the type of run does not describe)
    return calls


def test_beam_steps_fetch_the_head_and_greedy_steps_the_logits(tiny_artifacts: Path) -> None:
    model = open_model(tiny_artifacts / "translator")
    assert model.head_in_graph
    calls = recording(model)
    translate(model, [MIXED[2]])  # beam 3, every earlier token banned: k grows with the bans
    assert calls and all(LOGITS not in out and TOP_LOGPROBS in out for out, _ in calls)
    assert calls[0][1] == 6 and max(k for _, k in calls if k is not None) > 6
    calls.clear()
    translate(model, [MIXED[0]])
    assert calls and all(LOGITS in out and TOP_LOGPROBS not in out and k is None for out, k in calls)
    calls.clear()
    translate(model, MIXED[:2])  # both kinds in one batch: both, in one run
    assert all(LOGITS in out and TOP_LOGPROBS in out for out, _ in calls[:3])


def test_translations_are_the_same_with_and_without_the_graph_head(tiny_artifacts: Path) -> None:
    model = open_model(tiny_artifacts / "translator")
    with_head = translate(model, MIXED)
    model.head_in_graph = False  # the standalone head on the logits, as for graphs without one
    assert translate(model, MIXED) == with_head
    assert [len(h) for h in with_head] == [1] * 4 + [3] * 4 + [2] * 8 + [1] * 4
    assert all(h[0][0][0] == 9 for h in with_head[12:])  # the forced first token


def test_the_head_ranks_enough_candidates_under_a_heavy_ban(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k = 2 * num_beams + the row's bans from the graph's head gives what ranking the whole vocabulary gives."""
    model = open_model(tiny_artifacts / "translator")
    narrow = translate(model, [MIXED[2]])
    monkeypatch.setattr(translation, "beam_width", lambda beams, bans, vocab: vocab)
    assert translate(model, [MIXED[2]]) == narrow


def _export_without_head(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    from model.export import graphs
    from model.export.tiny import build_tiny_model
    from model.kinds import MODEL_KINDS

    model, tokenizer = build_tiny_model("translator")
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    specs = functools.partial(graphs.translator_specs, top_k=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(MODEL_KINDS, "translator", dataclasses.replace(MODEL_KINDS["translator"], graphs=specs))
        graphs.export_model("translator", model, tmp_path / "tokenizer.json", tmp_path / "translator", int8=False)
    return tmp_path / "translator"


def test_an_artifact_without_the_head_serves_the_same_translations(tiny_artifacts: Path, tmp_path: Path) -> None:
    folder = _export_without_head(tmp_path)
    artifact = load_artifact(folder)
    assert TOP_K not in artifact.graphs[DECODER].input_names
    sessions = {role: GraphSession(artifact.name, artifact.graphs[role], OPTIONS) for role in (ENCODER, DECODER)}
    check_artifact(artifact, sessions, artifact.load_tokenizer(), 64)
    old = open_model(folder)
    assert not old.head_in_graph and not old.decoder.has_output(TOP_IDS)
    assert translate(old, MIXED) == translate(open_model(tiny_artifacts / "translator"), MIXED)


REAL = Path(__file__).resolve().parents[2] / "artifacts" / "translator"


@pytest.mark.skipif(not (REAL / "config.json").is_file(), reason="artifacts/translator is absent")
def test_the_real_translator_with_the_head_appended_translates_the_same(tmp_path: Path) -> None:
    """The committed translator (exported before the head: served through the standalone head) and its
    decoder with the head appended, as a re-export would add it: the same hypotheses, scores and logprobs."""
    pytest.importorskip("torch")
    from model.export.graphs import describe_io
    from model.export.scoring_graph import append_head

    folder = tmp_path / "translator"
    shutil.copytree(REAL, folder)
    graph = onnx.load(str(folder / "decoder.onnx"))
    append_head(graph)
    onnx.save(graph, str(folder / "decoder.onnx"))
    config = json.loads((folder / "config.json").read_text())
    config["graphs"][DECODER] |= describe_io(folder / "decoder.onnx")  # what an export lists
    (folder / "config.json").write_text(json.dumps(config))
    settings = [(TranslationParams(num_beams=4, n_best=2, max_new_tokens=24, no_repeat_ngram_size=3), None),
                (TranslationParams(num_beams=1, max_new_tokens=24), None)]
    old, new = open_model(REAL), open_model(folder)
    assert new.head_in_graph and not old.head_in_graph
    assert translate(new, settings) == translate(old, settings)


def test_start_up_checks_refuse_a_head_that_ranks_otherwise(tiny_artifacts: Path, tmp_path: Path) -> None:
    folder = tmp_path / "translator"
    shutil.copytree(tiny_artifacts / "translator", folder)
    graph = onnx.load(str(folder / "decoder.onnx"))
    (top_k,) = [node for node in graph.graph.node if node.op_type == "TopK"]
    next(a for a in top_k.attribute if a.name == "largest").i = 0  # the least likely tokens
    onnx.save(graph, str(folder / "decoder.onnx"))
    golden = json.loads((folder / "golden.json").read_text())
    del golden["files"]["decoder.onnx"]  # the record would name the changed bytes first
    (folder / "golden.json").write_text(json.dumps(golden))
    artifact = load_artifact(folder)
    sessions = {role: GraphSession(artifact.name, artifact.graphs[role], OPTIONS) for role in (ENCODER, DECODER)}
    with pytest.raises(ArtifactError, match="top_ids"):
        check_artifact(artifact, sessions, artifact.load_tokenizer(), 64)
