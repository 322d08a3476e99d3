"""Start-up checks of an artifact against what it really contains: config.json's dimensions against the
graphs' inputs and outputs, the tokenizer against the vocabulary, and one tiny run of each graph at the
largest token id and position the config promises. A mismatch is an ArtifactError naming config.json, so
the server refuses to start instead of failing requests (one out-of-range row fails its whole batch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from service.contract.kinds import CLASSIFICATION, DECODER, ENCODER, TRANSLATION
from service.contract.names import (
    ATTENTION_MASK,
    ATTENTION_PREFIXES,
    ATTENTIONS,
    CROSS,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    KV_PREFIXES,
    LOGITS,
    LOGITS_TO_KEEP,
    PAST,
    POSITION_IDS,
    TOKEN_TYPE_IDS,
    kv_names,
)
from service.runtime.artifact import Artifact, ArtifactError, TensorSpec
from service.runtime.sessions import GraphSession

ORT_DTYPES = {"int64": "tensor(int64)", "float32": "tensor(float)", "float16": "tensor(float16)"}


def check_artifact(
    artifact: Artifact, sessions: Mapping[str, GraphSession], tokenizer: Tokenizer, max_input_tokens: int
) -> None:
    for role, session in sessions.items():
        _check_io(artifact, role, session)
    _check_tokenizer(artifact, tokenizer)
    _probe(artifact, sessions, max_input_tokens)


def _config(artifact: Artifact) -> str:
    return str(artifact.folder / "config.json")


def _expected_dims(artifact: Artifact, name: str, rank: int) -> dict[int, tuple[int, str]]:
    """Axis -> (size, the config field that states it) for the tensors whose sizes config.json implies."""
    if name.startswith(KV_PREFIXES) and rank == 4:
        return {1: (artifact.n_heads, "dims.n_heads"), 3: (artifact.d_head, "dims.d_head")}
    if name.startswith(ATTENTION_PREFIXES) and rank == 4:
        return {1: (artifact.n_heads, "dims.n_heads")}
    if name == LOGITS and artifact.contract is CLASSIFICATION:
        return {rank - 1: (len(artifact.labels), "labels")}
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


def _check_tokenizer(artifact: Artifact, tokenizer: Tokenizer) -> None:
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


def _run(
    artifact: Artifact, session: GraphSession, feeds: dict[str, np.ndarray], outputs: list[str], claim: str
) -> Any:
    try:
        return session.run(feeds, outputs)
    except Exception as exc:  # ORT's message names nodes; keep its first line, and say which claim failed
        detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise ArtifactError(f"{_config(artifact)}: {claim} does not fit {session.file.name} ({detail})") from None


def _ids(*rows: list[int]) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64)


def _empty_kv(artifact: Artifact, prefix: str, layers: int, batch: int = 1) -> dict[str, np.ndarray]:
    empty = np.zeros((batch, artifact.n_heads, 0, artifact.d_head), dtype=np.float32)
    return dict.fromkeys(kv_names(prefix, layers), empty)


def _probe(artifact: Artifact, sessions: Mapping[str, GraphSession], max_input_tokens: int) -> None:
    """Run each graph at the highest token id (vocab_size - 1) and the furthest position the server can
    use: max_positions - 1 where positions are inputs, else a sequence as long as the server allows."""
    last_id, positions = artifact.vocab_size - 1, artifact.max_positions
    vocab_claim = f"vocab_size {artifact.vocab_size}"
    length_claim = f"max_positions {positions}"
    if artifact.contract is CLASSIFICATION:
        enc = sessions[ENCODER]
        n = min(positions, max_input_tokens)
        for ids, claim in ((_ids([last_id]), vocab_claim), (np.zeros((1, n), dtype=np.int64), length_claim)):
            feeds = {INPUT_IDS: ids, TOKEN_TYPE_IDS: np.zeros_like(ids), ATTENTION_MASK: np.ones_like(ids)}
            _run(artifact, enc, feeds, [LOGITS], claim)
        return
    layers = artifact.n_decoder_layers
    dec = sessions[DECODER]
    cross: dict[str, np.ndarray] = {}
    if artifact.contract is TRANSLATION:
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
    if artifact.graphs[DECODER].keeps_last_logits:
        _probe_logits_to_keep(artifact, dec, cross)


def _probe_logits_to_keep(artifact: Artifact, dec: GraphSession, cross: dict[str, np.ndarray]) -> None:
    """A 3-token prefill with logits_to_keep = 1 returns the last position's logits, and with the
    default (0) all three, as the contract says (an int8 graph: the shapes only, since its dynamic
    activation scales depend on the positions present)."""
    claim = f"graphs.{DECODER}.inputs {LOGITS_TO_KEEP}"
    feeds = {
        INPUT_IDS: _ids([0, artifact.vocab_size - 1, 0]),
        ATTENTION_MASK: _ids([1, 1, 1]),
        POSITION_IDS: _ids([0, 1, 2]),
        **cross,
        **_empty_kv(artifact, PAST, artifact.n_decoder_layers),
    }
    every = np.asarray(_run(artifact, dec, feeds, [LOGITS], claim)[LOGITS])
    last = np.asarray(_run(artifact, dec, feeds | dec.last_logits_only, [LOGITS], claim)[LOGITS])
    same = dec.quantization == "int8" or np.allclose(last[:, 0], every[:, -1], atol=1e-3)
    if every.shape[1] != 3 or last.shape[1] != 1 or not same:
        raise ArtifactError(
            f"{_config(artifact)}: {claim}: {dec.file.name} returned logits of shape {list(last.shape)} for "
            f"{LOGITS_TO_KEEP}=1 and {list(every.shape)} without it (expected [1, 1, V], equal to the last "
            "of [1, 3, V])"
        )
