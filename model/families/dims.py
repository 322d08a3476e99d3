"""The sizes a checkpoint's config.json states, checked against the shapes of the tensors its weights hold
before any model is built: one check for every family, each family record saying where its config keeps
them (``ConfigDims``).

A size or head count must be a positive integer; the heads must split the hidden size and the key/value
heads the heads; the token embedding must be [vocab size, hidden size]; the layers counted in the weights
must be the layers stated, and every other size (feed-forward width, token types, relative buckets,
labels) the one its tensors have. A position limit is the size of the position table where the weights
hold one. Where positions are computed (rotary angles, sinusoids, T5's relative buckets) config.json is the
only source: a limit above ``MAX_COMPUTED_POSITIONS`` is lowered to it, and the notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from model.families.base import CheckpointError

# The longest context of the supported families' published checkpoints (Llama 3.1's 131,072 positions).
MAX_COMPUTED_POSITIONS = 131_072

Shapes = dict[str, tuple[int, ...]]  # tensor name (the family's prefix stripped) -> shape


@dataclass(frozen=True)
class Size:
    """A config.json size and the tensors that hold it on ``axis`` (each one present must agree)."""

    key: str
    tensors: tuple[str, ...] = ()
    axis: int = 0
    extra: int = 0  # rows beyond the size (BART's position tables start at row 2)
    required: bool = True  # else the key may be absent or null (the family's default applies)


@dataclass(frozen=True)
class ConfigDims:
    """Where a family's config.json keeps its sizes, and which tensors hold them."""

    hidden: str  # the model width
    embedding: str  # the token embedding, [vocab, hidden]
    heads: tuple[str, ...]  # attention head counts, each dividing the hidden size
    layers: tuple[Size, ...]  # layer counts; the tensor names' prefix of a layer, {i} where its index goes
    sizes: tuple[Size, ...] = ()  # the other sizes: feed-forward widths, token types, relative buckets
    positions: Size | None = None  # its tensors: the position tables; none present: computed positions
    kv_heads: Size | None = None  # key/value heads; tensor: the first layer's key projection [kv * d_head, hidden]
    head_dim: str | None = None  # a per-head width the config may state (Llama's head_dim, T5's d_kv): positive
    labels: str | None = None  # a trained classification head, [labels, ...]
    offset_token: str | None = None  # a token whose id shifts the positions (the padding id: RoBERTa, M2M100)
    vocab: str = "vocab_size"


def check_config(dims: ConfigDims, hf: dict[str, Any], shapes: Shapes, where: str) -> tuple[dict[str, Any], list[str]]:
    """``hf`` as the family may read it (a computed position limit lowered) and the notes to add; a
    CheckpointError naming the field (``where``: the config file) for a size the weights do not hold."""
    vocab, hidden = positive(hf, dims.vocab, where), positive(hf, dims.hidden, where)
    rows, cols = tensor_shape(shapes, dims.embedding)[:2]
    if rows != vocab:
        raise CheckpointError(f"{where}: {dims.vocab}={vocab} but {dims.embedding} holds {rows} tokens")
    if cols != hidden:
        raise CheckpointError(f"{where}: {dims.hidden}={hidden} but {dims.embedding} is {rows} x {cols}")
    check_heads(dims, hf, shapes, where)
    for layers in dims.layers:
        check_layers(layers, hf, shapes, where)
    for size in dims.sizes:
        check_size(size, hf, shapes, where)
    check_labels(dims.labels, hf, shapes, where)
    if dims.offset_token is not None:
        token = hf.get(dims.offset_token)
        if not is_int(token) or not 0 <= token < vocab:
            raise CheckpointError(f"{where}: {dims.offset_token}={token!r} must be a token id below {dims.vocab}="
                                  f"{vocab} (positions start after it)")
    return position_limit(dims.positions, hf, shapes, where)


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def positive(hf: dict[str, Any], key: str, where: str) -> int:
    """config.json's ``key``, which must be there: a positive integer."""
    value = hf.get(key)
    if value is None:
        raise CheckpointError(f"{where}: {key} is required")
    if not is_int(value) or value <= 0:
        raise CheckpointError(f"{where}: {key}={value!r} must be a positive integer")
    return value


def optional(hf: dict[str, Any], key: str, where: str) -> int | None:
    """config.json's ``key`` where it may be absent or null (a default applies): else a positive integer."""
    return None if hf.get(key) is None else positive(hf, key, where)


def stated(size: Size, hf: dict[str, Any], where: str) -> int | None:
    return positive(hf, size.key, where) if size.required else optional(hf, size.key, where)


def tensor_shape(shapes: Shapes, name: str) -> tuple[int, ...]:
    if name not in shapes:
        raise CheckpointError(f"the checkpoint lacks tensor {name!r}")
    return shapes[name]


def check_heads(dims: ConfigDims, hf: dict[str, Any], shapes: Shapes, where: str) -> None:
    """The head counts divide the hidden size, the key/value heads the heads, and the key projection holds
    the key/value heads."""
    hidden = positive(hf, dims.hidden, where)
    for key in dims.heads:
        if hidden % positive(hf, key, where):
            raise CheckpointError(f"{where}: {key}={hf[key]} must divide {dims.hidden}={hidden}")
    if dims.head_dim:  # one that does not split the width over the heads is the family's to refuse by name
        optional(hf, dims.head_dim, where)
    kv = optional(hf, dims.kv_heads.key, where) if dims.kv_heads else None
    if dims.kv_heads is None or kv is None:
        return
    heads_key = dims.heads[0]
    heads = positive(hf, heads_key, where)
    if heads % kv:
        raise CheckpointError(f"{where}: {dims.kv_heads.key}={kv} must divide {heads_key}={heads}")
    width = hidden // heads
    for name in dims.kv_heads.tensors:
        rows = tensor_shape(shapes, name)[0]
        if rows != kv * width:
            raise CheckpointError(f"{where}: {dims.kv_heads.key}={kv} but {name} has {rows} rows (expected {kv} "
                                  f"heads x {width})")


def held_layers(prefix: str, shapes: Shapes) -> int:
    """How many layers, 0 up, have tensors under ``prefix`` (a tensor missing inside one is the mapping's to name)."""
    count = 0
    while any(name.startswith(prefix.format(i=count)) for name in shapes):
        count += 1
    return count


def check_layers(layers: Size, hf: dict[str, Any], shapes: Shapes, where: str) -> None:
    count = stated(layers, hf, where)
    if count is None:
        return
    for prefix in layers.tensors:
        held = held_layers(prefix, shapes)
        if held != count:
            raise CheckpointError(f"{where}: {layers.key}={count} but the weights hold {held} layers "
                                  f"({prefix.format(i='N')}*)")


def check_size(size: Size, hf: dict[str, Any], shapes: Shapes, where: str) -> None:
    value = stated(size, hf, where)
    if value is None:
        return
    for name in size.tensors:
        if name in shapes and len(shapes[name]) > size.axis and shapes[name][size.axis] != value + size.extra:
            held = shapes[name][size.axis] - size.extra
            raise CheckpointError(f"{where}: {size.key}={value} but {name} holds {held} (shape {list(shapes[name])})")


def check_labels(head: str | None, hf: dict[str, Any], shapes: Shapes, where: str) -> None:
    """A trained head's rows are its classes: as many as id2label names (else num_labels, else 2)."""
    if head is None or head not in shapes:
        return
    id2label = hf.get("id2label")
    if id2label:
        key, count = "id2label", len(id2label) if isinstance(id2label, dict) else -1
        if count < 0:
            raise CheckpointError(f"{where}: id2label must be an object (index -> label)")
    else:
        key, count = "num_labels", optional(hf, "num_labels", where) or 2
    if shapes[head][0] != count:
        raise CheckpointError(f"{where}: {key} gives {count} labels but {head} holds {shapes[head][0]}")


def position_limit(positions: Size | None, hf: dict[str, Any], shapes: Shapes,
                   where: str) -> tuple[dict[str, Any], list[str]]:
    """The position limit a table holds must be the stated one; a computed one is lowered to the cap."""
    if positions is None:
        return hf, []
    limit = stated(positions, hf, where)
    if limit is None:
        return hf, []
    check_size(positions, hf, shapes, where)
    if any(name in shapes for name in positions.tensors) or limit <= MAX_COMPUTED_POSITIONS:
        return hf, []
    note = (f"{positions.key}={limit} lowered to {MAX_COMPUTED_POSITIONS}: the positions are computed, no table "
            "in the weights bounds them, and that is the longest context of the families' published checkpoints")
    return {**hf, positions.key: MAX_COMPUTED_POSITIONS}, [note]
