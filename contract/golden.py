"""golden.json: what an export recorded about its own artifact, and the start-up checks against it.

The export (model/export/golden.py) records three things the server can recompute from the files it is about
to serve:

- each graph's outputs for fixed inputs (``golden.json[<role>]``) and the sha256 of each graph file
  (``golden.json["files"]``): catch edited, corrupted or swapped weights, the digest even where the
  outputs for a few token ids would not show it (one row of an embedding);
- the tokenizer's ids, type ids and decoded text for a few sample texts, the token behind each special
  id and a digest of the vocabulary (``golden.json["tokenizer"]``): catches a tokenizer.json swapped for
  another of the same size, which the graphs run happily and answer wrongly;
- the config.json fields the graphs cannot vouch for (``golden.json["config"]``): special-token ids,
  labels, max_positions, vocab_size, dims.

A difference stops the server with one line naming the file that differs. Artifacts exported before a
section existed lack it; the checks skip what is not recorded (see `missing_sections`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from contract.kinds import TASKS
from contract.names import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    IN_PLACE_AXIS,
    PAST,
    POSITION_IDS,
    TOKEN_TYPE_IDS,
    TensorSpec,
)

GOLDEN_FILE = "golden.json"
TOKENIZER, CONFIG, FILES = "tokenizer", "config", "files"  # golden.json's sections besides the graph roles
BATCH, SEQ, PAST_LEN = 2, 4, 3

# Capitals (lower-casing normalizers), accents (accent stripping), digits, both languages, a double space,
# a newline and an emoji (unknown-token handling): each part of a tokenizer shows in some of these ids.
SAMPLE_TEXTS = (
    "God said, Let there be light.",
    "A wonderful, moving film.",
    "Au commencement, Dieu créa les cieux et la terre.",
    'In 1990, the café\'s naïve owner said:  "Déjà vu!"\n🙂',
)
SAMPLE_PAIRS = (("The plot is thin.", "The acting saves it."),)  # classification: the second segment's type ids
CONFIG_FIELDS = ("vocab_size", "max_positions", "special_tokens", "labels", "dims")

# (relative, share of the output's mean magnitude) a start-up run may differ by from the export's CPU run:
# threads and fusions on the CPU; on CUDA also its kernels (TF32 matmuls by default), never measured here,
# so 5x looser. A replaced or corrupted graph is far off either way (the files' sha256 catches the rest).
CPU_TOLERANCE, DEVICE_TOLERANCE = (1e-2, 2e-2), (5e-2, 1e-1)


# --- graphs -------------------------------------------------------------------------------------------


def golden_inputs(vocab_size: int, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Deterministic inputs for every required graph input, sized from the symbolic shapes in config.json
    (optional inputs keep their default, so adding one leaves the golden outputs as they were). A graph
    whose cache is written in place gets a whole prompt (its buffers as long as the prompt), the second
    row one token shorter (right padded, as that cache's rows are)."""
    rng = np.random.default_rng(0)
    in_place = any(IN_PLACE_AXIS in spec.shape for spec in inputs)
    past_len = 0 if in_place else PAST_LEN
    sizes = {"batch": BATCH, "seq": SEQ, "src": SEQ + 1, "past": past_len, "total": past_len + SEQ,
             IN_PLACE_AXIS: SEQ}
    has_past = any(spec.name.startswith(f"{PAST}.") for spec in inputs)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        name = spec.name
        if spec.default is not None:
            continue
        shape = [sizes[d] if isinstance(d, str) else d for d in spec.shape]
        if name in (ATTENTION_MASK, ENCODER_ATTENTION_MASK):
            feeds[name] = np.ones(shape, dtype=np.int64)
            feeds[name][1, 0] = 0  # one padded position in the second row
        elif name == POSITION_IDS:
            feeds[name] = np.tile(np.arange(shape[1], dtype=np.int64), (shape[0], 1)) + (past_len if has_past else 0)
        elif name == TOKEN_TYPE_IDS:
            feeds[name] = np.zeros(shape, dtype=np.int64)
            feeds[name][:, shape[1] // 2 :] = 1
        elif spec.dtype == "int64":
            feeds[name] = rng.integers(4, vocab_size, size=shape, dtype=np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    if f"{PAST}.0.key" in feeds:  # attention_mask covers past + new positions in graphs that take a cache
        feeds[ATTENTION_MASK] = np.ones((BATCH, past_len + SEQ), dtype=np.int64)
        feeds[ATTENTION_MASK][1, -1 if in_place else 0] = 0
    return feeds


def summarize(array: np.ndarray) -> dict[str, Any]:
    flat = array.reshape(-1).astype(np.float64)
    return {"shape": list(array.shape), "head": flat[:8].tolist(), "sum": float(flat.sum()),
            "abs_sum": float(np.abs(flat).sum())}


def output_difference(
    array: np.ndarray, recorded: Mapping[str, Any], tolerance: tuple[float, float] | None = CPU_TOLERANCE
) -> str | None:
    """How ``array`` differs from its recorded summary beyond ``tolerance``, or None. ``tolerance=None``
    compares the shape only (an int8 graph against its float graph's record)."""
    if list(array.shape) != list(recorded["shape"]):
        return f"shape {list(array.shape)}, recorded {recorded['shape']}"
    if tolerance is None:
        return None
    rtol, scale_tol = tolerance
    flat = array.reshape(-1).astype(np.float64)
    head = np.asarray(recorded["head"], dtype=np.float64)
    scale = float(recorded["abs_sum"]) / max(1, flat.size)  # the output's mean magnitude
    abs_sum = float(np.abs(flat).sum())
    # NaN compares false: a graph that returns NaN differs.
    if not np.allclose(flat[: head.size], head, rtol=rtol, atol=scale_tol * scale):
        return f"first values {np.round(flat[: head.size], 4).tolist()}, recorded {np.round(head, 4).tolist()}"
    if not abs(abs_sum - float(recorded["abs_sum"])) <= rtol * float(recorded["abs_sum"]) + scale_tol * scale:
        return f"sum of magnitudes {abs_sum:.6g}, recorded {float(recorded['abs_sum']):.6g}"
    return None


def file_digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def record_files(folder: Path, graphs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """golden.json's files section: the sha256 of each graph file (and int8 variant) config.json names."""
    names = [name for graph in graphs.values() for name in (graph.get("file"), graph.get("int8_file")) if name]
    return {name: file_digest(folder / name) for name in names}


# --- tokenizer and config -----------------------------------------------------------------------------


def vocab_digest(tokenizer: Tokenizer) -> str:
    """sha256 of the (token, id) pairs: any edit of the vocabulary, not only of the sample texts' tokens."""
    pairs = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: (item[1], item[0]))
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


def encode_sample(tokenizer: Tokenizer, text: str | Sequence[str]) -> dict[str, Any]:
    """What the server gets from the tokenizer for ``text`` (a string, or a pair as [a, b])."""
    pair = not isinstance(text, str)
    encoding = tokenizer.encode(text[0], text[1]) if pair else tokenizer.encode(text)
    sample: dict[str, Any] = {"text": list(text) if pair else text, "ids": list(encoding.ids)}
    if pair:
        sample["type_ids"] = list(encoding.type_ids)
    sample["decoded"] = tokenizer.decode(encoding.ids, skip_special_tokens=True)
    return sample


def load_served_tokenizer(path: Path) -> Tokenizer:
    """A tokenizer file loaded as the server runs it: the server enforces its own length limits with a clear
    4xx, so the tokenizer's own truncation and padding are off (a silent truncation would hide them)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def record_tokenizer(tokenizer: Tokenizer, task: str, special_tokens: Mapping[str, int]) -> dict[str, Any]:
    """golden.json's tokenizer section for a tokenizer loaded as the server loads it (load_served_tokenizer)."""
    texts: list[str | Sequence[str]] = [*SAMPLE_TEXTS, *(SAMPLE_PAIRS if TASKS[task].text_pairs else ())]
    return {
        "samples": [encode_sample(tokenizer, text) for text in texts],
        # id and token, not the id alone: checking the tokenizer needs nothing from config.json
        "special_tokens": {role: {"id": token_id, "token": tokenizer.id_to_token(token_id)}
                           for role, token_id in special_tokens.items()},
        "vocab_sha256": vocab_digest(tokenizer),
    }


def record_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """golden.json's config section: config.json's fields that no graph run can check."""
    return {field: config[field] for field in CONFIG_FIELDS if field in config}


def tokenizer_difference(tokenizer: Tokenizer, recorded: Mapping[str, Any]) -> str | None:
    """How ``tokenizer`` differs from its recorded section, or None."""
    for sample in recorded.get("samples", []):
        got = encode_sample(tokenizer, sample["text"])
        for key in ("ids", "type_ids"):
            if key in sample and got.get(key) != sample[key]:
                return f"encodes {sample['text']!r} as {key} {got.get(key)}, recorded {sample[key]}"
        decoded = tokenizer.decode(sample["ids"], skip_special_tokens=True)
        if decoded != sample["decoded"]:
            return f"decodes {sample['text']!r}'s ids as {decoded!r}, recorded {sample['decoded']!r}"
    for role, special in recorded.get("special_tokens", {}).items():
        token_id, token = special["id"], special["token"]
        if tokenizer.id_to_token(token_id) != token:
            return f"special token {role} (id {token_id}) is {tokenizer.id_to_token(token_id)!r}, recorded {token!r}"
    digest = recorded.get("vocab_sha256")
    if digest is not None and vocab_digest(tokenizer) != digest:
        return "its vocabulary differs from the recorded one (vocab_sha256)"
    return None


def config_difference(config: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    """The first config.json field (or field.key, in special_tokens and dims) that differs from its recorded
    value, or None."""
    for field, value in recorded.items():
        got = config.get(field)
        if got == value:
            continue
        if isinstance(got, dict) and isinstance(value, dict):
            key = next(k for k in [*value, *got] if got.get(k) != value.get(k))
            field, got, value = f"{field}.{key}", got.get(key), value.get(key)
        return f"{field} is {json.dumps(got)}, but {GOLDEN_FILE} recorded {json.dumps(value)}"
    return None


# --- the file -----------------------------------------------------------------------------------------


def read_golden(folder: Path) -> dict[str, Any] | None:
    """golden.json as a dict; None where there is none. Raises ValueError (with the reason) if unreadable."""
    path = folder / GOLDEN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {GOLDEN_FILE} ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{GOLDEN_FILE} is not an object of sections")
    return data


def missing_sections(golden: Mapping[str, Any] | None, roles: Sequence[str]) -> list[str]:
    """The sections a current export writes that ``golden`` lacks (older exports): unchecked at start-up."""
    if golden is None:
        return [GOLDEN_FILE]
    return [section for section in (*roles, TOKENIZER, CONFIG, FILES) if section not in golden]
