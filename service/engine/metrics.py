"""Prometheus metrics, one registry per app (so several apps in one process, as in tests, never collide)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    multiprocess,
    values,
)

# serve_request_success's finished_reason, in vLLM's words (vllm:request_success_total): the engine's "eos"
# (the model's end token) and "stop" (a stop string or stop token) are both vLLM's "stop".
FINISHED_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "error": "error"}
SHARED_FOLDER = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: where every process writes its values
SHARED_PREFIX = "serve-metrics-"  # then the pid of the process that made the folder, and a unique part


def finished_reason(reason: str) -> str:
    """The engine's finish reason as serve_request_success labels it (one it has no word for: as it is)."""
    return FINISHED_REASONS.get(reason, reason)


def share_metrics_between_processes() -> None:
    """Every process's metrics in one folder of memory-mapped files (prometheus_client's multiprocess
    mode), so /metrics in any front-end process answers for the whole server (SERVE_API_PROCESSES > 1).
    Call it in the first process before any Metrics is built; forked processes write files of their own.
    The folder goes when this process exits, and the folders of servers that were killed (no exit
    handler ran) when the next one starts."""
    _remove_orphaned_folders()
    folder = tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-")
    os.environ[SHARED_FOLDER] = folder
    values.ValueClass = values.MultiProcessValue()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def _remove_orphaned_folders() -> None:
    for folder in Path(tempfile.gettempdir()).glob(f"{SHARED_PREFIX}*-*"):
        pid = folder.name.removeprefix(SHARED_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Declared per concern, in the order /metrics lists them.
        self._http_metrics()
        self._scheduling_metrics()
        self._decoding_metrics()
        self._admission_metrics()
        self._request_metrics()
        self.runtime = self._gauge(
            "serve_runtime_info",
            "1, labelled with ONNX Runtime's threads as the server set them: intra-op threads per session (0: ONNX "
            "Runtime's choice), whether they spin between runs, and the CPU limit read from the cgroup (0: none).",
            ("intra_op_threads", "spin_between_runs", "cpu_limit"),
        )
        # process_* (CPU, memory, file descriptors) and python_* for this registry, as the default one has;
        # shared between processes, these would describe only the one that answers, so they are left out.
        self.shared_folder = os.environ.get(SHARED_FOLDER)
        if self.shared_folder is None:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            self.registry.register(GC_COLLECTOR)

    # Most metrics are per model, and most histograms time something: those are the defaults.
    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ("model",)) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...] = ("model",)) -> Gauge:
        # Shared between processes, a gauge is the sum over the living ones (each sets its own part).
        return Gauge(name, doc, labels, registry=self.registry, multiprocess_mode="livesum")

    def _histogram(
        self, name: str, doc: str, labels: tuple[str, ...] = ("model",), buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def _http_metrics(self) -> None:
        by_status = ("endpoint", "status")
        self.requests = self._counter("serve_requests", "HTTP requests by endpoint and status.", by_status)
        self.request_duration = self._histogram(
            "serve_request_duration_seconds", "HTTP request duration by endpoint and status.", by_status
        )

    def _scheduling_metrics(self) -> None:
        self.queue_time = self._histogram("serve_queue_time_seconds", "Time from admission to the first model run.")
        self.batch_size = self._histogram(
            "serve_batch_size",
            "Rows per model run (phase prefill: newcomers, a classifier's whole run; decode: one step).",
            ("model", "phase"),
            BATCH_BUCKETS,
        )
        self.queue_depth = self._gauge("serve_queue_depth", "Requests waiting for a batch slot.")
        self.running = self._gauge(
            "serve_running_sequences", "Sequences prefilling or decoding (one per request item)."
        )
        self.running_rows = self._gauge("serve_running_rows", "Batch rows of the running sequences (beams count each).")

    def _decoding_metrics(self) -> None:
        """Token timing, the KV cache and the prefix store, and the tokens generated."""
        self.time_to_first_token = self._histogram(
            "serve_time_to_first_token_seconds", "Admission to first generated token."
        )
        self.inter_token_latency = self._histogram(
            "serve_inter_token_latency_seconds",
            "Time between consecutive tokens of one sequence.",
            buckets=TOKEN_BUCKETS,
        )
        self.time_per_output_token = self._histogram(
            "serve_time_per_output_token_seconds",
            "Per finished generation: its decode time over its tokens after the first (vLLM's time_per_output_token).",
            buckets=TOKEN_BUCKETS,
        )
        self.kv_cache_usage = self._gauge(
            "serve_kv_cache_usage_perc",
            "Share of SERVE_KV_CACHE_BYTES holding keys and values: running sequences' and the prefix store's (0-1).",
        )
        self.prefix_cache_queries = self._counter(
            "serve_prefix_cache_queries", "Prompt tokens looked up in the prefix store"
        )
        self.prefix_cache_hits = self._counter(
            "serve_prefix_cache_hits", "Prompt tokens found in the prefix store (reused)."
        )
        self.generated_tokens = self._counter("serve_generated_tokens", "Tokens generated.")

    def _admission_metrics(self) -> None:
        self.rejected = self._counter("serve_rejected", "Requests refused before running.", ("model", "reason"))
        self.cancelled = self._counter("serve_cancelled", "Requests dropped after the client went away.")
        self.inflight = self._gauge("serve_inflight_requests", "Inference requests being handled.", ())

    def _request_metrics(self) -> None:
        """Per-request metrics named after vLLM's (vllm:e2e_request_latency_seconds, ...), with a model label."""
        self.prompt_tokens = self._counter("serve_prompt_tokens", "Prompt tokens processed.")
        self.e2e_latency = self._histogram(
            "serve_e2e_request_latency_seconds", "Queueing to the last result of one sequence or item, per model."
        )
        self.request_success = self._counter(
            "serve_request_success",
            "Finished generations by finish reason, in vLLM's words: stop (the end token or a stop string), length.",
            ("model", "finished_reason"),
        )
        self.prefill_time = self._histogram(
            "serve_request_prefill_time_seconds", "Admission to the first generated token."
        )
        self.decode_time = self._histogram("serve_request_decode_time_seconds", "First to last generated token.")

    def render(self) -> bytes:
        """The Prometheus text format: this registry's, or every process's where they share a folder."""
        if self.shared_folder is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.shared_folder)
        return generate_latest(registry)


@dataclass(frozen=True)
class ModelMetrics:
    """One model's children of the per-model metrics, looked up once: `labels()` takes a lock and builds a
    key on every call, and the scheduler's worker updates these several times a step (at one text at a
    time they took about a fifth as long as the model run)."""

    queue_depth: Any
    running: Any
    running_rows: Any
    queue_time: Any
    e2e_latency: Any
    prefill_batch: Any
    decode_batch: Any
    cancelled: Any
    queue_full: Any
    kv_cache_usage: Any

    @classmethod
    def of(cls, metrics: Metrics, model: str) -> ModelMetrics:
        return cls(
            queue_depth=metrics.queue_depth.labels(model),
            running=metrics.running.labels(model),
            running_rows=metrics.running_rows.labels(model),
            queue_time=metrics.queue_time.labels(model),
            e2e_latency=metrics.e2e_latency.labels(model),
            prefill_batch=metrics.batch_size.labels(model, "prefill"),
            decode_batch=metrics.batch_size.labels(model, "decode"),
            cancelled=metrics.cancelled.labels(model),
            queue_full=metrics.rejected.labels(model, "queue_full"),
            kv_cache_usage=metrics.kv_cache_usage.labels(model),
        )
