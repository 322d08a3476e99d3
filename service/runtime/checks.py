"""Start-up checks of an artifact against what it really contains: config.json and tokenizer.json against
what the export recorded in golden.json, config.json's dimensions against the graphs' inputs and outputs,
the tokenizer against the vocabulary and the special tokens, one tiny run of each graph at the largest
token id and position the config promises, and each graph's outputs against golden.json. A mismatch is an
ArtifactError naming the file, so the server refuses to start instead of failing requests (one
out-of-range row fails its whole batch) or answering them wrongly (a swapped tokenizer or weights)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from contract.golden import (
    CONFIG,
    CPU_TOLERANCE,
    DEVICE_TOLERANCE,
    FILES,
    GOLDEN_FILE,
    SAMPLE_TEXTS,
    TOKENIZER,
    config_difference,
    file_digest,
    golden_inputs,
    missing_sections,
    output_difference,
    tokenizer_difference,
)
from contract.kinds import DECODER, ENCODER
from contract.names import (
    ATTENTION_MASK,
    ATTENTION_PREFIXES,
    ATTENTIONS,
    CROSS,
    EMBEDDINGS,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    KV_PREFIXES,
    LOGITS,
    LOGITS_TO_KEEP,
    PAST,
    POSITION_IDS,
    TOKEN_TYPE_IDS,
    TOP_IDS,
    TOP_K,
    TOP_LOGPROBS,
    TensorSpec,
    kv_names,
)
from service.runtime.artifact import Artifact, ArtifactError
from service.runtime.sessions import GraphSession, to_numpy

log = logging.getLogger(__name__)

ORT_DTYPES = {"int64": "tensor(int64)", "float32": "tensor(float)", "float16": "tensor(float16)"}


def check_artifact(
    artifact: Artifact, sessions: Mapping[str, GraphSession], tokenizer: Tokenizer, max_input_tokens: int
) -> None:
    # Each check names the file it finds at fault, so the order matters: the tokenizer and the graph files
    # against their records first (neither record depends on config.json); then config.json against the
    # graphs (which say most precisely what is wrong with it), against its record, and its special tokens
    # against the tokenizer (for artifacts without records).
    _check_recorded_tokenizer(artifact, tokenizer)
    _check_recorded_files(artifact, sessions)
    for role, session in sessions.items():
        _check_io(artifact, role, session)
    _check_vocabulary(artifact, tokenizer)
    cross = _probe(artifact, sessions, max_input_tokens)
    _check_recorded_config(artifact)
    _check_special_tokens(artifact, tokenizer)
    _check_recorded_outputs(artifact, sessions)  # before the next probe: a graph that returns NaN is the graph's fault
    if DECODER in sessions and artifact.graphs[DECODER].keeps_last_logits:
        _probe_logits_to_keep(artifact, sessions[DECODER], cross)
    if DECODER in sessions and artifact.graphs[DECODER].ranks_top_k:
        _probe_top_k(artifact, sessions[DECODER], cross)
    if missing := missing_sections(artifact.golden, list(artifact.graphs)):
        log.warning(
            "%s: %s (an older export), so start-up cannot check what it covers; re-export it, or record the "
            "tokenizer, config and graph files as they are with `python -m model.export.golden --add %s`",
            artifact.folder,
            f"no {GOLDEN_FILE}" if artifact.golden is None else f"{GOLDEN_FILE} lacks {', '.join(missing)}",
            artifact.folder,
        )


def _config(artifact: Artifact) -> str:
    return str(artifact.folder / "config.json")


def _config_fields(artifact: Artifact) -> dict[str, Any]:
    """config.json's fields as the server read them, under their config.json names."""
    fields: dict[str, Any] = {
        "vocab_size": artifact.vocab_size,
        "max_positions": artifact.max_positions,
        "special_tokens": artifact.special_tokens,
        "dims": artifact.dims,
    }
    if artifact.contract.labels:
        fields["labels"] = list(artifact.labels)
    if artifact.contract.pooled:
        fields |= {
            "pooling": artifact.pooling,
            "normalize": artifact.normalize,
            "dimensions_truncatable": artifact.dimensions_truncatable,
        }
    return fields


@contextmanager
def _readable(artifact: Artifact, section: str) -> Iterator[None]:
    """A golden.json section that is valid JSON but not what the export writes: one line naming it."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(
            f"{artifact.folder / GOLDEN_FILE}: its {section} section is malformed ({type(exc).__name__}: {exc})"
        ) from None


def _check_recorded_config(artifact: Artifact) -> None:
    recorded = (artifact.golden or {}).get(CONFIG)
    if recorded is None:
        return
    with _readable(artifact, CONFIG):
        difference = config_difference(_config_fields(artifact), recorded)
    if difference:
        raise ArtifactError(f"{_config(artifact)}: {difference} at export; this config is not the model's")


def _check_recorded_tokenizer(artifact: Artifact, tokenizer: Tokenizer) -> None:
    recorded = (artifact.golden or {}).get(TOKENIZER)
    if recorded is None:
        return
    with _readable(artifact, TOKENIZER):
        difference = tokenizer_difference(tokenizer, recorded)
    if difference:
        raise ArtifactError(
            f"{artifact.tokenizer_file}: {difference} in {GOLDEN_FILE} at export; this is not the tokenizer the "
            "model was exported with"
        )


def _check_recorded_files(artifact: Artifact, sessions: Mapping[str, GraphSession]) -> None:
    recorded = (artifact.golden or {}).get(FILES, {})
    for session in sessions.values():
        digest = recorded.get(session.file.name)
        if digest is not None and file_digest(session.file) != digest:
            raise ArtifactError(f"{session.file}: its sha256 differs from the one recorded in {GOLDEN_FILE} at export")


def _check_recorded_outputs(artifact: Artifact, sessions: Mapping[str, GraphSession]) -> None:
    """Each graph's outputs for golden.json's inputs, recorded on the CPU (an int8 graph: their shapes;
    its record is the float graph's)."""
    for role, session in sessions.items():
        recorded = (artifact.golden or {}).get(role)
        if not recorded:
            continue
        names = [name for name in recorded if session.has_output(name)]
        feeds = golden_inputs(artifact.vocab_size, artifact.graphs[role].inputs)
        outputs = _run(artifact, session, feeds, names, f"{GOLDEN_FILE}'s {role} input")
        tolerance: tuple[float, float] | None = CPU_TOLERANCE if session.device == "cpu" else DEVICE_TOLERANCE
        if session.quantization == "int8":
            tolerance = None
        for name in names:
            with _readable(artifact, role):
                difference = output_difference(to_numpy(outputs[name]), recorded[name], tolerance)
            if difference:
                raise ArtifactError(
                    f"{session.file}: {name} for {GOLDEN_FILE}'s input has {difference} at export (a changed "
                    "graph, or a runtime that computes it differently)"
                )


def _expected_dims(artifact: Artifact, name: str, rank: int) -> dict[int, tuple[int, str]]:
    """Axis -> (size, the config field that states it) for the tensors whose sizes config.json implies."""
    if name.startswith(KV_PREFIXES) and rank == 4:
        heads = "dims.n_kv_heads" if "n_kv_heads" in artifact.dims else "dims.n_heads"
        return {1: (artifact.n_kv_heads, heads), 3: (artifact.d_head, "dims.d_head")}
    if name.startswith(ATTENTION_PREFIXES) and rank == 4:
        return {1: (artifact.n_heads, "dims.n_heads")}
    if name == LOGITS and artifact.contract.labels:
        return {rank - 1: (len(artifact.labels), "labels")}
    if name == EMBEDDINGS:
        return {rank - 1: (artifact.dims["d_model"], "dims.d_model")} if "d_model" in artifact.dims else {}
    if name == LOGITS:
        return {rank - 1: (artifact.vocab_size, "vocab_size")}
    return {}


def _check_io(artifact: Artifact, role: str, session: GraphSession) -> None:
    graph = session.file.name
    where = f"{_config(artifact)}: graphs.{role}"
    real = {t.name: t for t in [*session.session.get_inputs(), *session.session.get_outputs()]}
    spec = artifact.graphs[role]
    unfed = [i.name for i in session.session.get_inputs() if i.name not in spec.input_names]
    if unfed:
        raise ArtifactError(f"{where}: {graph} needs inputs {unfed} that config.json does not list (layer count?)")
    overridable = {i.name: i for i in session.session.get_overridable_initializers()}
    for tensor in spec.inputs:
        if tensor.default is None and tensor.name in overridable:
            raise ArtifactError(f"{where}: {tensor.name} is optional in {graph}; config.json must state its default")
        if tensor.default is not None and tensor.name in session.input_names:
            raise ArtifactError(f"{where}: {tensor.name} has no default in {graph}, but config.json states one")
    real |= overridable
    layers = artifact.contract.layers(role, artifact.dims)
    attention = [name for name in real if name.startswith(f"{ATTENTIONS}.")]
    if attention and len(attention) != layers:
        raise ArtifactError(
            f"{_config(artifact)}: the layer count says {layers}, but {graph} has {len(attention)} attention outputs"
        )
    declared: list[TensorSpec] = [*spec.inputs, *spec.outputs]
    for tensor in declared:
        actual = real.get(tensor.name)
        if actual is None:
            continue  # a promised input that is missing is caught when the session loads; outputs are optional
        if len(actual.shape) != len(tensor.shape):
            raise ArtifactError(
                f"{where}: {tensor.name} has rank {len(actual.shape)} in {graph}, {len(tensor.shape)} here"
            )
        if tensor.dtype in ORT_DTYPES and actual.type != ORT_DTYPES[tensor.dtype]:
            raise ArtifactError(f"{where}: {tensor.name} is {actual.type} in {graph}, {tensor.dtype} here")
        for axis, (stated, size) in enumerate(zip(tensor.shape, actual.shape, strict=True)):
            if isinstance(stated, int) and isinstance(size, int) and stated != size:
                raise ArtifactError(f"{where}: {tensor.name} axis {axis} is {size} in {graph}, {stated} here")
        for axis, (size, field) in _expected_dims(artifact, tensor.name, len(actual.shape)).items():
            if isinstance(actual.shape[axis], int) and actual.shape[axis] != size:
                raise ArtifactError(
                    f"{_config(artifact)}: {field} says {size}, but {tensor.name} in {graph} has {actual.shape[axis]}"
                )


def _check_vocabulary(artifact: Artifact, tokenizer: Tokenizer) -> None:
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > artifact.vocab_size:
        tokenizer_file = artifact.tokenizer_file.name
        raise ArtifactError(
            f"{_config(artifact)}: vocab_size is {artifact.vocab_size}, but {tokenizer_file} has {size} tokens"
        )
    bad = {k: v for k, v in artifact.special_tokens.items() if not 0 <= v < artifact.vocab_size}
    if bad:
        raise ArtifactError(
            f"{_config(artifact)}: special_tokens {bad} are outside the vocabulary (vocab_size {artifact.vocab_size})"
        )


def _check_special_tokens(artifact: Artifact, tokenizer: Tokenizer) -> None:
    """The special-token ids config.json states against what the tokenizer does with them, for artifacts
    without recorded goldens: the unknown token, and the framing the contract expects of an encoding
    (Task.encoding_frame: a translator's source ends with eos; a classifier's input is cls ... sep)."""
    specials = artifact.special_tokens
    expected: dict[str, tuple[int, int]] = {}  # role -> (position in the encoding, id there)
    unk_token = getattr(tokenizer.model, "unk_token", None)
    unk = tokenizer.token_to_id(unk_token) if isinstance(unk_token, str) else None
    if "unk" in specials and unk is not None:
        expected["unk"] = (-1, unk)  # not a position: the model's own unknown token
    ids = tokenizer.encode(SAMPLE_TEXTS[0]).ids
    if ids:
        frame = artifact.contract.encoding_frame
        expected |= {role: (position % len(ids), ids[position]) for role, position in frame.items()}
    for role, (position, token_id) in expected.items():
        if specials.get(role, token_id) != token_id:
            where = "its unknown token" if position < 0 else f"position {position} of {SAMPLE_TEXTS[0]!r}"
            raise ArtifactError(
                f"{_config(artifact)}: special_tokens.{role} is {specials[role]}, but {artifact.tokenizer_file} puts "
                f"{tokenizer.id_to_token(token_id)!r} (id {token_id}) at {where}"
            )


def _run(
    artifact: Artifact, session: GraphSession, feeds: dict[str, np.ndarray], outputs: Sequence[str], claim: str
) -> Any:
    try:
        return session.run(feeds, outputs)
    except Exception as exc:  # ORT's message names nodes; keep its first line, and say which claim failed
        detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise ArtifactError(f"{_config(artifact)}: {claim} does not fit {session.file.name} ({detail})") from None


def _ids(*rows: list[int]) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64)


def _empty_kv(artifact: Artifact, prefix: str, layers: int, batch: int = 1) -> dict[str, np.ndarray]:
    empty = np.zeros((batch, artifact.n_kv_heads, 0, artifact.d_head), dtype=np.float32)
    return dict.fromkeys(kv_names(prefix, layers), empty)


def _probe(artifact: Artifact, sessions: Mapping[str, GraphSession], max_input_tokens: int) -> dict[str, np.ndarray]:
    """Run each graph at the highest token id (vocab_size - 1) and the furthest position the server can
    use: max_positions - 1 where positions are inputs, else a sequence as long as the server allows.
    Returns a translator's cross-attention feeds for further decoder probes (none for other tasks)."""
    last_id, positions = artifact.vocab_size - 1, artifact.max_positions
    vocab_claim = f"vocab_size {artifact.vocab_size}"
    length_claim = f"max_positions {positions}"
    if artifact.contract.one_step:
        enc = sessions[ENCODER]
        n = min(positions, max_input_tokens)
        output = artifact.contract.graph_io(ENCODER, artifact.dims).outputs[0]
        for ids, claim in ((_ids([last_id]), vocab_claim), (np.zeros((1, n), dtype=np.int64), length_claim)):
            feeds = {INPUT_IDS: ids, ATTENTION_MASK: np.ones_like(ids)}
            if TOKEN_TYPE_IDS in enc.input_names:
                feeds[TOKEN_TYPE_IDS] = np.zeros_like(ids)
            _run(artifact, enc, feeds, [output], claim)
        return {}
    layers = artifact.n_decoder_layers
    dec = sessions[DECODER]
    cross: dict[str, np.ndarray] = {}
    if artifact.contract.cross_attention:
        enc = sessions[ENCODER]
        names = kv_names(CROSS, layers)
        n = min(positions, max_input_tokens)
        _run(artifact, enc, {INPUT_IDS: _ids([last_id]), ATTENTION_MASK: _ids([1])}, names, vocab_claim)
        out = _run(
            artifact,
            enc,
            {INPUT_IDS: np.zeros((1, n), dtype=np.int64), ATTENTION_MASK: np.ones((1, n), dtype=np.int64)},
            names,
            length_claim,
        )
        cross = {ENCODER_ATTENTION_MASK: np.ones((1, n), dtype=np.int64), **{k: np.asarray(v) for k, v in out.items()}}
    for token, position, claim in ((last_id, 0, vocab_claim), (0, positions - 1, length_claim)):
        feeds = {
            INPUT_IDS: _ids([token]),
            ATTENTION_MASK: _ids([1]),
            POSITION_IDS: _ids([position]),
            **cross,
            **_empty_kv(artifact, PAST, layers),
        }
        _run(artifact, dec, feeds, [LOGITS], claim)
    return cross


def _probe_logits_to_keep(artifact: Artifact, dec: GraphSession, cross: dict[str, np.ndarray]) -> None:
    """A 3-token prefill with logits_to_keep = 1 returns the last position's logits, and with the
    default (0) all three, as the contract says (an int8 graph: the shapes only, since its dynamic
    activation scales depend on the positions present)."""
    claim = f"graphs.{DECODER}.inputs {LOGITS_TO_KEEP}"
    feeds = _three_tokens(artifact, cross)
    every = np.asarray(_run(artifact, dec, feeds, [LOGITS], claim)[LOGITS])
    last = np.asarray(_run(artifact, dec, feeds | dec.last_logits_only, [LOGITS], claim)[LOGITS])
    same = dec.quantization == "int8" or np.allclose(last[:, 0], every[:, -1], atol=1e-3)
    if every.shape[1] != 3 or last.shape[1] != 1 or not same:
        raise ArtifactError(
            f"{_config(artifact)}: {claim}: {dec.file.name} returned logits of shape {list(last.shape)} for "
            f"{LOGITS_TO_KEEP}=1 and {list(every.shape)} without it (expected [1, 1, V], equal to the last "
            "of [1, 3, V])"
        )


def _three_tokens(artifact: Artifact, cross: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A decoder's feeds for a 3-token prefill (empty cache)."""
    return {
        INPUT_IDS: _ids([0, artifact.vocab_size - 1, 0]),
        ATTENTION_MASK: _ids([1, 1, 1]),
        POSITION_IDS: _ids([0, 1, 2]),
        **cross,
        **_empty_kv(artifact, PAST, artifact.n_decoder_layers),
    }


def _probe_top_k(artifact: Artifact, dec: GraphSession, cross: dict[str, np.ndarray]) -> None:
    """With k = 3, top_ids are the last position's 3 most likely tokens (ties to the lower id) and
    top_logprobs their log-softmax, as the engine's beam search reads them instead of the logits."""
    claim = f"graphs.{DECODER}.inputs {TOP_K}"
    feeds = _three_tokens(artifact, cross) | {TOP_K: np.array([3], dtype=np.int64)}
    out = _run(artifact, dec, feeds, [LOGITS, TOP_LOGPROBS, TOP_IDS], claim)
    last = np.asarray(out[LOGITS], dtype=np.float64)[:, -1]
    ids, values = np.asarray(out[TOP_IDS]), np.asarray(out[TOP_LOGPROBS])
    best = np.argsort(-last, axis=1, kind="stable")[:, :3]
    logprobs = last - last.max(axis=1, keepdims=True)
    logprobs -= np.log(np.exp(logprobs).sum(axis=1, keepdims=True))
    expected = np.take_along_axis(logprobs, best, axis=1)
    if ids.shape != best.shape or not (ids == best).all() or not np.allclose(values, expected, atol=1e-4):
        raise ArtifactError(
            f"{_config(artifact)}: {claim}: {dec.file.name} returned top_ids {ids.tolist()} for k=3 where its logits' "
            f"3 most likely tokens are {best.tolist()} (expected them, best first, with their log-softmax)"
        )
