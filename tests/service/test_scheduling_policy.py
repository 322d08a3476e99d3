"""The scheduling policy alone: admission, batching waits and the prefill budget, on a fake clock
(no threads, no sleeps). tests/service/test_engine_scheduler.py drives the worker that carries it out."""

from __future__ import annotations

import pytest

from service.engine.errors import InvalidInput, QueueFull
from service.engine.scheduling import MAX_PREFILL_TOKENS, STEP_PREFILL_TOKENS, SchedulingPolicy
from service.engine.sequence import Sequence


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_policy(
    clock: FakeClock, max_rows: int = 8, max_queue_size: int = 4, max_wait_s: float = 0.01
) -> SchedulingPolicy[Sequence]:
    return SchedulingPolicy("m", max_rows=max_rows, max_queue_size=max_queue_size, max_wait_s=max_wait_s, clock=clock)


def seqs(n: int, rows: int = 1, tokens: int = 1) -> list[Sequence]:
    return [Sequence(rows, tokens) for _ in range(n)]


def test_a_request_larger_than_the_queue_or_the_batch_is_a_422_naming_the_field() -> None:
    policy = make_policy(FakeClock())
    with pytest.raises(InvalidInput) as many:
        policy.check_request(seqs(5), "texts")
    assert many.value.field == "texts" and "SERVE_MAX_QUEUE_SIZE" in str(many.value)
    with pytest.raises(InvalidInput, match="SERVE_MAX_BATCH_SIZE"):
        policy.check_request(seqs(1, rows=9), "text")
    policy.check_request(seqs(4, rows=8), "texts")  # at the limits: accepted


def test_a_request_is_queued_whole_or_not_at_all() -> None:
    clock = FakeClock()
    policy = make_policy(clock)
    policy.enqueue(seqs(3))
    with pytest.raises(QueueFull, match="3 waiting, limit 4"):
        policy.enqueue(seqs(2))
    assert len(policy.waiting) == 3  # the refused request left nothing behind
    clock.now = 101.0
    last = seqs(1)
    policy.enqueue(last)
    assert last[0].enqueued == 101.0


def test_cancelled_sequences_leave_the_queue() -> None:
    policy = make_policy(FakeClock())
    queued = seqs(3)
    policy.enqueue(queued)
    assert policy.drop([queued[1], *seqs(1)]) == 1
    assert list(policy.waiting) == [queued[0], queued[2]]


def test_a_lone_arrival_and_a_running_batch_never_wait() -> None:
    policy = make_policy(FakeClock())
    policy.enqueue(seqs(1))
    assert policy.company_wait(idle=True) <= 0
    policy.enqueue(seqs(1))
    assert policy.company_wait(idle=False) <= 0


def test_a_burst_waits_from_its_oldest_arrival_until_the_batch_is_full() -> None:
    clock = FakeClock()
    policy = make_policy(clock, max_rows=3, max_wait_s=0.01)
    policy.enqueue(seqs(1))
    clock.now += 0.004
    policy.enqueue(seqs(1))
    assert policy.company_wait(idle=True) == pytest.approx(0.006)
    clock.now += 0.006
    assert policy.company_wait(idle=True) <= 0  # the oldest waited max_wait_s
    clock.now -= 0.006
    policy.enqueue(seqs(1))  # three rows: the batch is full, nothing to wait for
    assert policy.company_wait(idle=True) <= 0


def test_admission_is_first_come_first_served_within_the_free_rows() -> None:
    clock = FakeClock()
    policy = make_policy(clock, max_rows=4)
    beams, single, late = Sequence(rows=3), Sequence(rows=1), Sequence(rows=1)
    policy.enqueue([beams, single, late])
    clock.now = 100.5
    assert policy.admit(batch_rows=None) == [beams, single]
    assert beams.admitted == single.admitted == 100.5 and late.admitted is None
    assert policy.admit(batch_rows=4) == []  # a full batch admits nobody
    assert policy.admit(batch_rows=3) == [late]


def test_a_wide_sequence_at_the_head_is_not_overtaken() -> None:
    policy = make_policy(FakeClock(), max_rows=4)
    wide, narrow = Sequence(rows=4), Sequence(rows=1)
    policy.enqueue([wide, narrow])
    assert policy.admit(batch_rows=1) == []  # the head needs 4 rows; nobody jumps the queue
    assert policy.admit(batch_rows=None) == [wide]


def test_the_prefill_budget_is_smaller_while_a_batch_decodes() -> None:
    policy = make_policy(FakeClock(), max_rows=64, max_queue_size=64)
    tokens = STEP_PREFILL_TOKENS // 2
    policy.enqueue(seqs(40, tokens=tokens))
    assert len(policy.admit(batch_rows=1)) == 2  # 2 x 128 padded tokens fill the step's budget
    assert len(policy.admit(batch_rows=None)) == MAX_PREFILL_TOKENS // tokens


def test_a_prompt_longer_than_the_budget_is_admitted_alone() -> None:
    policy = make_policy(FakeClock())
    long, short = Sequence(prefill_tokens=STEP_PREFILL_TOKENS * 3), Sequence(prefill_tokens=1)
    policy.enqueue([long, short])
    assert policy.admit(batch_rows=1) == [long]  # padding the short one to its length would pass the budget
    assert policy.admit(batch_rows=1) == [short]


def test_the_cache_budget_admits_first_come_first_served_and_refuses_what_never_fits() -> None:
    """Each sequence reserves its worst case (cache_tokens x 10 bytes here): one that does not fit the room left
    waits, and so does everyone behind it; one beyond the whole budget is a 422 naming max_new_tokens."""
    policy: SchedulingPolicy[Sequence] = SchedulingPolicy(
        "m", max_rows=8, max_queue_size=8, max_wait_s=0.0, clock=FakeClock(),
        cache_budget=100, cache_cost=lambda seq: 10 * seq.cache_tokens,
    )
    big, small, smaller = seqs(3)
    big.cache_tokens, small.cache_tokens, smaller.cache_tokens = 6, 5, 1
    policy.enqueue([big, small, smaller])
    assert policy.admit(None, cache_room=100) == [big]  # 60 + 50 > 100: small waits, and smaller behind it
    assert policy.admit(1, cache_room=40) == []
    assert policy.admit(1, cache_room=60) == [small, smaller]
    too_big = seqs(1)[0]
    too_big.cache_tokens = 11
    with pytest.raises(InvalidInput, match="SERVE_KV_CACHE_BYTES") as refused:
        policy.check_request([too_big], "prompt")
    assert refused.value.field == "max_new_tokens"
