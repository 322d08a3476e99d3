"""ONNX Runtime sessions: provider selection, the provider really in use, and IOBinding for device-resident KV."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeAlias

import numpy as np
import onnx
import onnxruntime as ort

from contract.names import LOGITS_TO_KEEP
from service.runtime.artifact import ArtifactError, GraphSpec
from service.runtime.cpu_limit import cpu_limit, usable_cpus
from service.runtime.fusion import Fusion, fuse_attention

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
ALLOW_SPINNING = "session.intra_op.allow_spinning"  # ORT session config key; unset means spin
FORCE_SPINNING_STOP = "session.force_spinning_stop"  # ORT session config key: park the threads as a run returns

# A tensor the engine passes around: numpy on the host, or an OrtValue that stays on the device.
Tensor: TypeAlias = np.ndarray | ort.OrtValue


def to_numpy(value: Tensor) -> np.ndarray:
    """Host copy of a tensor (no copy for numpy arrays)."""
    return value.numpy() if isinstance(value, ort.OrtValue) else value


@dataclass(frozen=True)
class RuntimeOptions:
    device: str = "auto"  # auto | cpu | cuda
    intra_op_threads: int = 0  # 0: one per usable CPU under a CPU limit, else ONNX Runtime's default
    inter_op_threads: int = 0
    quantization: str = "none"  # none | int8
    io_binding: bool | None = None  # None: only when the session really runs on CUDA
    busy_intra_op_threads: int | None = None  # None: one fewer than the intra-op threads
    fuse_attention: bool = True  # self-attention as fused nodes (service/runtime/fusion.py)
    spin_between_runs: bool | None = None  # False: threads park as a run returns; None: spin unless CPU-limited
    cpu_mem_arena: bool = True  # ONNX Runtime's CPU arena (off where the engine trims the heap when idle)

    def threads(self) -> int:
        """Intra-op threads: as set; else, under a CPU limit, one per usable CPU (ONNX Runtime's own choice,
        one per physical core, does not see the limit); else 0, ONNX Runtime's choice."""
        if self.intra_op_threads or cpu_limit() is None:
            return self.intra_op_threads
        return usable_cpus()

    def spins_between_runs(self) -> bool:
        """As set; unset, spin unless under a CPU limit, which counts a spinning thread's wait as work."""
        return self.spin_between_runs if self.spin_between_runs is not None else cpu_limit() is None

    def busy_threads(self) -> int | None:
        """Intra-op threads for a one-step model's run that serves several requests at once, or None when
        that is no fewer than the usual (no second session)."""
        threads = self.intra_op_threads or usable_cpus()
        busy = self.busy_intra_op_threads if self.busy_intra_op_threads is not None else max(1, threads - 1)
        return busy if busy < threads else None


def requested_providers(device: str) -> list[str]:
    """CUDA first when asked for (or auto) and this onnxruntime build has it; CPU always as the fallback."""
    if device == "cpu":
        return [CPU]
    if CUDA in ort.get_available_providers():
        return [CUDA, CPU]
    if device == "cuda":
        log.warning("SERVE_DEVICE=cuda but this onnxruntime build has no %s; running on CPU", CUDA)
    return [CPU]


# n_layers x d_model^2 (an encoder's cost per token) below which a one-step model's multi-request runs take
# the busy session. Measured over HTTP on 2 cores, 32 concurrent single texts, ours / CTranslate2 with one
# thread vs two (python -m benchmarks.anchor --rows classifier_c32,embedder_c32 --server-setting
# busy_intra_op_threads=2): our classifier (4 x 256^2 = 0.26M) 0.66 vs 0.62; MiniLM-sized encoders
# (6 x 384^2 = 0.88M) 0.54 vs 0.71 (classifier-minilm's dims) and 0.48 vs 0.73 (the embedder). A larger
# encoder's run is worth more than the event loop's work on its requests.
SMALL_ENCODER = 500_000


def leaves_a_core(dims: Mapping[str, int]) -> bool:
    """Whether a one-step model of these dims runs its multi-request batches on the busy session."""
    return dims.get("n_layers", 0) * dims.get("d_model", 0) ** 2 < SMALL_ENCODER


def artifact_sessions(
    model: str,
    graphs: Mapping[str, GraphSpec],
    options: RuntimeOptions,
    initializers: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
) -> dict[str, GraphSession]:
    """One session per graph of an artifact. Only the graph the worker runs most keeps its intra-op threads
    spin-waiting between runs: the decoder where there is one (it runs step after step), else the only
    graph. Measured over HTTP, 16 concurrent greedy translations: the encoder's threads spinning between
    arrivals took CPU from the decoder's (2,907 -> 3,727 tok/s without); a lone classifier encoder
    answers one text at a time 2x faster with them spinning. Without spinning between runs (so set, or
    under a CPU limit), every graph's threads spin within a run and park as it returns (ONNX Runtime's
    `session.force_spinning_stop`): less CPU per request, more throughput under load on few cores, slower
    answers one request at a time, and no throttling under a CPU limit (docs/benchmarks.md).

    A one-step model's graph gets a second, "busy" session with fewer threads (`busy_threads`) for runs
    under load (that answer several requests at once, or come right after such a run: `Company` in
    service/engine/encoder_batch.py): their siblings keep the event loop busy meanwhile (parsing,
    validating, answering), and all intra-op threads beside it oversubscribe the cores. Measured over HTTP
    on 2 cores, 32 concurrent single texts: the intra-op threads used 2.6-3.4 ms of CPU per request with
    2 threads, 1.4-1.6 with 1 (the same batches); a lone request among lone ones still gets every thread.
    That pays for small models only (`leaves_a_core`, from the artifact's `dims`; without them, every
    one-step model).

    `initializers`: weights the graph files leave out (contract/weights_package.py)."""
    spinning = "decoder" if "decoder" in graphs else next(iter(graphs))
    one_step = "decoder" not in graphs  # a classifier: one run answers its requests
    one_step = one_step and (dims is None or leaves_a_core(dims))
    return {
        role: GraphSession(
            model, spec, options, spin=role == spinning, busy_session=one_step, initializers=initializers
        )
        for role, spec in graphs.items()
    }


# What a session loads: the graph (a file, or a rewritten graph's bytes), what the rewrite did, and the
# external initializers (a weights package's) that graph reads.
_Source: TypeAlias = tuple[Path | bytes, Fusion | None, dict[str, ort.OrtValue]]


class GraphSession:
    """One ORT session for one graph of an artifact, with `run()` that hides plain-run vs IOBinding."""

    def __init__(
        self,
        model: str,
        spec: GraphSpec,
        options: RuntimeOptions,
        spin: bool = True,
        busy_session: bool = False,
        initializers: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.name = f"{model}/{spec.role}"
        self.spec = spec
        self.detached = False
        path, self.quantization = self._pick_file(spec, options.quantization)
        self.file = path
        requested = requested_providers(options.device)
        # ORT reads external initializers from these buffers for the session's life: keep them referenced.
        self._initializers = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in (initializers or {}).items()}
        self._options, self._providers = options, requested
        self.session, (source, self.fusion, needed) = self._load(path, spin, initializers or {})
        self._full_session: ort.InferenceSession | None = None  # the unfused graph, for attention maps
        # get_available_providers() can list CUDA where no GPU works; ORT then silently falls back.
        # get_providers() is the truth.
        self.provider = self.session.get_providers()[0]
        if requested[0] == CUDA and self.provider != CUDA:
            log.warning("%s: CUDA was requested but the session runs on %s", self.name, self.provider)
        self.device = "cuda" if self.provider == CUDA else "cpu"
        busy_threads = options.busy_threads() if busy_session and self.device == "cpu" else None
        # The "busy" session: fewer threads, for runs that answer several requests at once (see above).
        self.busy_session = (
            None
            if busy_threads is None
            else self._open(source, replace(options, intra_op_threads=busy_threads), spin, [CPU], needed)
        )
        self.io_binding = self.device == "cuda" if options.io_binding is None else options.io_binding
        if self.quantization == "int8" and self.device == "cuda":
            log.warning("%s: int8 graphs use CPU-only integer kernels; expect slow CUDA runs", self.name)
        self.input_names = [i.name for i in self.session.get_inputs()]  # required ones
        self.optional_input_names = [i.name for i in self.session.get_overridable_initializers()]
        dropped = sorted(self.fusion.dropped_outputs) if self.fusion else []  # still served, by the unfused graph
        self.output_names = [o.name for o in self.session.get_outputs()] + dropped
        missing = [n for n in spec.input_names if n not in self.input_names + self.optional_input_names]
        if missing:
            raise ArtifactError(f"{path}: the graph lacks inputs {missing} promised by config.json")
        # Fed by calls that need the logits of the last position only (a generator's prefill and steps).
        self.last_logits_only: dict[str, np.ndarray] = (
            {LOGITS_TO_KEEP: np.array(1, dtype=np.int64)} if spec.keeps_last_logits else {}
        )
        log.info(
            "%s: loaded %s on %s (quantization=%s, io_binding=%s)",
            self.name,
            path.name,
            self.provider,
            self.quantization,
            self.io_binding,
        )

    def _load(self, path: Path, spin: bool, weights: Mapping[str, np.ndarray]) -> tuple[ort.InferenceSession, _Source]:
        """The session and what it loaded: the graph with its self-attentions fused where that applies and the
        fused graph loads, else the graph as exported."""
        # Fused on CPU only: ONNX Runtime's CUDA kernels for the fused node are not measured here.
        fuse = self._options.fuse_attention and self._providers == [CPU]
        exported: _Source = (path, None, self._initializers)
        loaded = (self._fused(path, weights) if fuse else None) or exported
        source, fusion, needed = loaded
        try:
            return self._open(source, self._options, spin, self._providers, needed), loaded
        except ArtifactError as exc:
            if fusion is None:
                raise
            log.warning("%s: the fused graph did not load (%s); serving the graph as exported", self.name, exc)
            return self._open(path, self._options, spin, self._providers, self._initializers), exported

    def _open(
        self,
        source: Path | bytes,
        options: RuntimeOptions,
        spin: bool,
        providers: list[str],
        initializers: Mapping[str, ort.OrtValue],
    ) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(
                source if isinstance(source, bytes) else str(source),
                sess_options=self._session_options(options, spin, initializers),
                providers=providers,
            )
        except Exception as exc:  # a corrupt or truncated file: one line that names it
            detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise ArtifactError(f"{self.file}: ONNX Runtime cannot load this graph ({detail})") from None

    def _fused(self, path: Path, weights: Mapping[str, np.ndarray]) -> _Source | None:
        """The graph with its self-attentions fused and the package weights it still reads; None where
        nothing matched (or the file cannot be read here: the session's load then reports it)."""
        try:
            fused = fuse_attention(onnx.load(str(path), load_external_data=False), weights)
        except Exception as exc:  # the unfused graph still serves; never a reason not to load
            log.warning("%s: attention fusion skipped (%s)", self.name, str(exc).splitlines()[0][:200])
            return None
        if fused is None:
            return None
        external = {t.name for t in fused.model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
        if not external <= weights.keys():  # weights in files beside the graph: a graph from bytes cannot find them
            return None
        done = fused.fusion
        message = "%s: fused %d self-attentions (%d with one QKV matmul)"
        log.info(message, self.name, done.attentions, done.merged_projections)
        needed = {name: value for name, value in self._initializers.items() if name in external}
        return fused.model.SerializeToString(), done, needed

    def _session_for(self, outputs: Collection[str], busy: bool) -> ort.InferenceSession:
        """The unfused graph where a fused layer's attention probabilities are asked for (opened on first
        use); else the busy session for runs under load where there is one; else the session."""
        if self.fusion is not None and not self.fusion.dropped_outputs.isdisjoint(outputs):
            if self._full_session is None:
                self._full_session = self._open(self.file, self._options, False, self._providers, self._initializers)
            return self._full_session
        return self.busy_session if busy and self.busy_session is not None else self.session

    def _pick_file(self, spec: GraphSpec, quantization: str) -> tuple[Path, str]:
        if quantization == "int8":
            if spec.int8_file is not None:
                return spec.int8_file, "int8"
            log.info(
                "%s: SERVE_QUANTIZATION=int8 but the artifact has no int8_file; using %s", self.name, spec.file.name
            )
        return spec.file, "none"

    @staticmethod
    def _session_options(
        options: RuntimeOptions, spin: bool, initializers: Mapping[str, ort.OrtValue]
    ) -> ort.SessionOptions:
        so = ort.SessionOptions()
        if initializers:
            so.add_external_initializers(list(initializers), list(initializers.values()))
        if not options.spins_between_runs():
            so.add_session_config_entry(FORCE_SPINNING_STOP, "1")  # spin within a run only
        elif not spin:
            so.add_session_config_entry(ALLOW_SPINNING, "0")
        # The arena grows to the largest batch yet and never shrinks (96 concurrent generations left RSS
        # ~300 MB higher for good); without it a run's tensors go back to malloc as it returns, and the
        # engine's idle trim hands them to the OS (service/engine/heap_trim.py, docs/operations.md).
        so.enable_cpu_mem_arena = options.cpu_mem_arena
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = options.threads()
        so.inter_op_num_threads = options.inter_op_threads
        so.log_severity_level = 3
        return so

    def place(self, value: Tensor) -> Tensor:
        """Put a tensor that will be fed many times where this session computes (once, not per run)."""
        if not self.io_binding or isinstance(value, ort.OrtValue):
            return value
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), self.device, 0)

    def detach(self) -> None:
        """Refuse every run from now on: a front-end process (SERVE_API_PROCESSES > 1) is forked with the
        engine's sessions, whose thread pools live only in the engine process; a run there would hang."""
        self.detached = True

    def has_output(self, name: str) -> bool:
        return name in self.output_names

    def run_in_place(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str], cache: Mapping[str, tuple[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """Run with each cache buffer bound as an input and as the output that aliases it (past -> present,
        buffer): the graph writes the new keys and values into the buffers (service/engine/cache/slots.py). The
        buffers are host memory: a CUDA session copies them each run (the in-place path is measured on CPU)."""
        if self.detached:
            raise RuntimeError(f"{self.name}: this is a front-end process; models run in the engine process")
        binding = self.session.io_binding()
        for name, value in feeds.items():
            if name in self.optional_input_names:  # IOBinding takes an overridable initializer as an OrtValue only
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.asarray(value)))
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in outputs:  # bound first: get_outputs() lists them first
            binding.bind_output(name, "cpu")
        for past, (present, buffer) in cache.items():
            value = ort.OrtValue.ortvalue_from_numpy(buffer)  # the buffer's memory itself, not a copy
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return {name: values[i].numpy() for i, name in enumerate(outputs)}

    def run(
        self, feeds: Mapping[str, Tensor], outputs: Sequence[str], keep: Collection[str] = (), busy: bool = False
    ) -> dict[str, Tensor]:
        """Run the graph. Outputs named in `keep` stay where the session computed them (an OrtValue on
        the device under IOBinding) so they can be fed back next step; the rest come back as numpy.
        `busy`: the run is under load (several requests at once; the busy session, where there is one)."""
        if self.detached:
            raise RuntimeError(f"{self.name}: this is a front-end process; models run in the engine process")
        if not self.io_binding:
            host = {name: to_numpy(value) for name, value in feeds.items()}
            return dict(zip(outputs, self._session_for(outputs, busy).run(list(outputs), host), strict=True))
        session = self._session_for(outputs, busy=False)
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            elif name in self.optional_input_names:  # IOBinding takes an overridable initializer as an OrtValue only
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.asarray(value)))
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in outputs:
            binding.bind_output(name, self.device if name in keep else "cpu")
        session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return {name: (v if name in keep else v.numpy()) for name, v in zip(outputs, values, strict=True)}
