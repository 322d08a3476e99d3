"""Prometheus metrics, one registry per app (so several apps in one process, as in tests, never collide)."""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "serve_requests", "HTTP requests by endpoint and status.", ["endpoint", "status"], registry=r
        )
        self.request_duration = Histogram(
            "serve_request_duration_seconds",
            "HTTP request duration by endpoint and status.",
            ["endpoint", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "serve_queue_time_seconds",
            "Time from admission to the first model run.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "serve_batch_size",
            "Rows per model run (phase prefill: newcomers, a classifier's whole run; decode: one step).",
            ["model", "phase"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("serve_queue_depth", "Requests waiting for a batch slot.", ["model"], registry=r)
        self.running = Gauge(
            "serve_running_sequences", "Sequences prefilling or decoding (one per request item).", ["model"], registry=r
        )
        self.running_rows = Gauge(
            "serve_running_rows", "Batch rows of the running sequences (beams count each).", ["model"], registry=r
        )
        self.time_to_first_token = Histogram(
            "serve_time_to_first_token_seconds",
            "Admission to first generated token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "serve_inter_token_latency_seconds",
            "Time between consecutive tokens of one sequence.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.generated_tokens = Counter("serve_generated_tokens", "Tokens generated.", ["model"], registry=r)
        self.rejected = Counter("serve_rejected", "Requests refused before running.", ["model", "reason"], registry=r)
        self.cancelled = Counter(
            "serve_cancelled", "Requests dropped after the client went away.", ["model"], registry=r
        )
        self.inflight = Gauge("serve_inflight_requests", "Inference requests being handled.", registry=r)
        # Per-request metrics named after vLLM's (vllm:e2e_request_latency_seconds, ...), with a model label.
        self.prompt_tokens = Counter("serve_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r)
        self.e2e_latency = Histogram(
            "serve_e2e_request_latency_seconds",
            "Queueing to the last result of one sequence or item, per model.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_success = Counter(
            "serve_request_success",
            "Finished generations by finish reason (eos, stop, length).",
            ["model", "finished_reason"],
            registry=r,
        )
        self.prefill_time = Histogram(
            "serve_request_prefill_time_seconds",
            "Admission to the first generated token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.decode_time = Histogram(
            "serve_request_decode_time_seconds",
            "First to last generated token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # process_* (CPU, memory, file descriptors) and python_* for this registry, as the default one has.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        r.register(GC_COLLECTOR)
