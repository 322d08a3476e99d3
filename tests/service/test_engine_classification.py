from typing import Any

import numpy as np

from service.engine.tasks.classification.service import ClassificationJob, ClassifyInput

INPUTS: list[ClassifyInput] = [
    "The movie was wonderful.",
    "A dull, tedious and predictable story with no heart at all, from start to finish.",
    ("A dull story.", "The movie was wonderful."),
    "ok",
]


async def test_batched_scores_equal_single_scores(serving) -> None:
    async with serving(max_batch_size=8, max_wait_ms=50) as s:
        clf = s.engine.classifier
        fields = [f"text[{i}]" for i in range(len(INPUTS))]
        batched = await (await clf.submit(ClassificationJob(INPUTS, fields))).results()
        singles = [await (await clf.submit(ClassificationJob([x], ["text"]))).result() for x in INPUTS]
        prefills = s.engine.metrics.registry.get_sample_value(
            "serve_batch_size_count", {"model": "classifier", "phase": "prefill"}
        )
        assert prefills == 1 + len(INPUTS)  # the four texts of one request ran as one batch
    for b, one in zip(batched, singles, strict=True):
        np.testing.assert_allclose(list(b.scores.values()), list(one.scores.values()), atol=1e-5)
        assert b.label == one.label and b.input_tokens == one.input_tokens


async def test_pairs_use_segment_ids(served) -> None:
    clf = served.engine.classifier
    (item,) = clf.tokenize([("a b", "c")], ["text"], attention=False)
    assert item.type_ids[-1] == 1 and item.type_ids[0] == 0


async def test_a_run_for_several_requests_uses_the_busy_session(serving, monkeypatch) -> None:
    """One request (any number of texts) gets every intra-op thread; a batch of several requests the busy
    session, which leaves the event loop a core, and so does a lone request right after such a batch (a run
    of one under load)."""
    async with serving(intra_op_threads=2, max_batch_size=8, max_wait_ms=200) as s:
        clf = s.engine.classifier
        assert clf.model.session.busy_session is not None
        runs: list[bool] = []
        run = clf.model.session.run
        def recording(*a: Any, busy: bool = False, **k: Any) -> Any:
            runs.append(busy)
            return run(*a, busy=busy, **k)

        monkeypatch.setattr(clf.model.session, "run", recording)
        job = ClassificationJob(INPUTS, [f"text[{i}]" for i in range(len(INPUTS))])
        alone = await (await clf.submit(job)).results()
        with clf.scheduler._cond:  # the worker takes neither before both are queued (an RLock: submit re-enters)
            handles = [await clf.submit(ClassificationJob([x], ["text"])) for x in INPUTS[:2]]
        together = [await h.result() for h in handles]
        after = [await (await clf.submit(ClassificationJob([INPUTS[0]], ["text"]))).result() for _ in range(2)]
    assert runs == [False, True, True, False]
    np.testing.assert_allclose(list(after[0].scores.values()), list(after[1].scores.values()), atol=1e-5)
    for one, other in zip(alone[:2], together, strict=True):
        np.testing.assert_allclose(list(one.scores.values()), list(other.scores.values()), atol=1e-5)
