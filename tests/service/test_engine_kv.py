import numpy as np

from service.engine.cache.appended import CrossState, KVCache


def cache(mask: list[list[int]], fill: float) -> KVCache:
    m = np.array(mask, dtype=np.int64)
    past = np.full((m.shape[0], 2, m.shape[1], 4), fill, dtype=np.float32)
    return KVCache(m, [past, past.copy()])


def test_positions_follow_the_mask_not_the_padding() -> None:
    c = cache([[0, 0, 1, 1], [1, 1, 1, 1]], 0.0)
    feeds = c.feeds(np.ones((2, 1), dtype=np.int64))
    assert feeds["position_ids"].tolist() == [[2], [4]]
    assert feeds["attention_mask"].shape == (2, 5)


def test_concat_left_pads_and_take_trims() -> None:
    long, short = cache([[1, 1, 1]], 1.0), cache([[1]], 2.0)
    both = KVCache.concat([long, short])
    assert both.mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert both.past[0][1, :, :2].sum() == 0 and both.past[0][1, :, 2].mean() == 2.0
    only_short = both.take(np.array([1]))
    assert only_short.mask.tolist() == [[1]]  # the all-padding columns are gone
    assert only_short.past[0].shape == (1, 2, 1, 4)


def test_take_can_repeat_rows_for_beams() -> None:
    c = cache([[1, 1]], 3.0)
    beams = c.take(np.array([0, 0, 0]))
    assert beams.mask.shape == (3, 2) and beams.past[1].shape == (3, 2, 2, 4)


def test_cross_state_right_pads_and_trims() -> None:
    a = CrossState(np.array([[1, 1, 1]]), [np.ones((1, 2, 3, 4), np.float32)] * 2)
    b = CrossState(np.array([[1]]), [np.ones((1, 2, 1, 4), np.float32)] * 2)
    both = CrossState.concat([a, b])
    assert both.mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert both.take(np.array([1])).mask.tolist() == [[1]]
    assert set(both.feeds()) == {"encoder_attention_mask", "cross.0.key", "cross.0.value"}
