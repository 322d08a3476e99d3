"""The split of a scheduled encoder batch into runs of similar length, and the padded feeds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from service.engine.encoder_batch import RUN_COST_TOKENS, Company, encoder_feeds, length_groups, run_in_groups


def cost(lengths: list[int], groups: list[list[int]]) -> int:
    return sum(len(g) * max(lengths[i] for i in g) + RUN_COST_TOKENS for g in groups)


def test_one_long_text_does_not_pad_the_short_ones() -> None:
    lengths = [10] * 31 + [256]
    groups = length_groups(lengths)
    assert groups == [list(range(31)), [31]]
    assert cost(lengths, groups) < 32 * 256


def test_similar_lengths_share_one_run() -> None:
    assert length_groups([10, 12, 11, 9]) == [[3, 0, 2, 1]]


@pytest.mark.parametrize("lengths", [[5, 200, 7, 180, 6], [1, 2, 3, 64, 65, 300, 2], [40] * 5 + [90, 91]])
def test_the_split_is_the_cheapest_contiguous_split(lengths: list[int]) -> None:
    """Against every way to cut the sorted rows into contiguous runs."""
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    cheapest = min(
        cost(lengths, [order[a:b] for a, b in itertools.pairwise((0, *cuts, n))])
        for k in range(n)
        for cuts in itertools.combinations(range(1, n), k)
    )
    assert cost(lengths, groups) == cheapest


def test_results_come_back_in_input_order() -> None:
    lengths = [300, 3, 290, 4]
    calls: list[list[int]] = []

    def run(group: list[int]) -> list[str]:
        calls.append(group)
        return [f"row{i}" for i in group]

    assert run_in_groups(lengths, run) == ["row0", "row1", "row2", "row3"]
    assert len(calls) == 2


def test_feeds_are_right_padded_with_optional_token_types() -> None:
    feeds = encoder_feeds([[5, 6, 7], [8]], [[0, 0, 1], [0]], pad=0)
    assert feeds["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert feeds["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert "token_type_ids" not in encoder_feeds([[5]], None, pad=1)
    assert feeds["input_ids"].dtype == np.int64


def test_a_run_keeps_company_one_run_after_several_requests() -> None:
    """Several requests in a run, or in the run before it, make it a busy one; a request's several texts
    are one request."""
    one, other = object(), object()
    company = Company()
    runs = [[one], [one, one], [one, other], [one], [other], [one, other], [other, other]]
    assert [company.busy(handles) for handles in runs] == [False, False, True, True, False, True, True]
