import numpy as np

from service.engine.classification import ClassifyInput

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
        batched = await clf.classify(INPUTS, fields)
        singles = [(await clf.classify([x], ["text"]))[0] for x in INPUTS]
    for b, one in zip(batched, singles, strict=True):
        np.testing.assert_allclose(list(b.scores.values()), list(one.scores.values()), atol=1e-5)
        assert b.label == one.label and b.input_tokens == one.input_tokens


async def test_pairs_use_segment_ids(served) -> None:
    clf = served.engine.classifier
    (item,) = clf.tokenize([("a b", "c")], ["text"], attention=False)
    assert item.type_ids[-1] == 1 and item.type_ids[0] == 0
