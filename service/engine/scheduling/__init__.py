"""Continuous batching: the policy (pure: admission, batching waits, the prefill budget) and the worker
thread that carries it out for one model."""

from service.engine.scheduling.policy import MAX_PREFILL_TOKENS, STEP_PREFILL_TOKENS, SchedulingPolicy
from service.engine.scheduling.queue import SequenceQueue
from service.engine.scheduling.worker import Scheduler, WorkerExecutor

__all__ = [
    "MAX_PREFILL_TOKENS",
    "STEP_PREFILL_TOKENS",
    "Scheduler",
    "SchedulingPolicy",
    "SequenceQueue",
    "WorkerExecutor",
]
