"""Load and validate an artifact folder (config.json is the whole contract; see artifacts/README.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from contract.golden import GOLDEN_FILE, load_served_tokenizer, read_golden
from contract.kinds import POOLING_MODES, TASKS, Task
from contract.names import IN_PLACE_AXIS, LOGITS_TO_KEEP, PAST, TOP_IDS, TOP_K, TOP_LOGPROBS, TensorSpec
from contract.weights_package import WEIGHTS_PACKAGE, WeightsPackage, parse_weights_package
from service.runtime.chat_template_spec import CHAT_TEMPLATE, ChatTemplateSpec, parse_chat_template

FORMAT_VERSION = 1
# config.json "generation_defaults": a generator's defaults (SamplingParams names, and max_new_tokens), each
# with the range a request's own value must be in (service/api/native/schemas.py), so that a default that fills an
# omitted field is never one a request could not send: (type, lowest, highest, lowest allowed).
GENERATION_DEFAULTS: dict[str, tuple[type, float, float, bool]] = {
    "temperature": (float, 0.0, 10.0, True),
    "top_p": (float, 0.0, 1.0, False),
    "top_k": (int, 0, 2**31 - 1, True),
    "repetition_penalty": (float, 0.0, 10.0, False),
    "max_new_tokens": (int, 1, 2**31 - 1, True),
}


class ArtifactError(ValueError):
    """The artifact folder does not follow the contract; the message says where and how."""


@dataclass(frozen=True)
class GraphSpec:
    role: str
    file: Path
    int8_file: Path | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def required_input_names(self) -> list[str]:
        return [t.name for t in self.inputs if t.default is None]

    @property
    def keeps_last_logits(self) -> bool:
        """The graph takes ``logits_to_keep`` (generator exports since it was added; imports and older
        exports compute the logits of every position)."""
        return LOGITS_TO_KEEP in self.input_names

    @property
    def writes_cache_in_place(self) -> bool:
        """The cache inputs are buffers of ``capacity`` positions that the graph writes the new keys and values
        into (generator exports since the in-place cache; model/network/in_place.py); else ``present`` is the
        past with the new tokens appended."""
        return any(t.name.startswith(f"{PAST}.") and t.shape[2:3] == (IN_PLACE_AXIS,) for t in self.inputs)

    @property
    def ranks_top_k(self) -> bool:
        """The graph takes ``k`` and outputs the last position's ``top_logprobs``/``top_ids`` (translator
        decoder exports since the scoring head was added; older exports and imports have the logits only)."""
        return TOP_K in self.input_names and {TOP_LOGPROBS, TOP_IDS} <= set(self.output_names)


@dataclass(frozen=True)
class Artifact:
    folder: Path
    name: str
    task: str
    architecture: str
    dims: dict[str, int]
    vocab_size: int
    max_positions: int
    special_tokens: dict[str, int]
    labels: tuple[str, ...]
    graphs: dict[str, GraphSpec]
    tokenizer_file: Path
    card: dict[str, Any] = field(default_factory=dict)
    golden: dict[str, Any] | None = None  # golden.json: what the export recorded (None for a folder without one)
    # An embedder's: how its graph pools (informational), whether its vectors are normalised by default,
    # and whether a prefix of its dimensions is itself an embedding (Matryoshka training).
    pooling: str | None = None
    normalize: bool = False
    dimensions_truncatable: bool = False
    weights_package: WeightsPackage | None = None  # graph weights an installed package ships
    # A generator's end tokens when more than special_tokens.eos (config.json "eos_token_ids", from an imported
    # checkpoint's generation_config.json), and its default sampling settings ("generation_defaults").
    eos_token_ids: tuple[int, ...] = ()
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    banned_token_ids: tuple[int, ...] = ()  # config.json "bad_words_ids" ([[id], ...]): never generated
    chat_template: ChatTemplateSpec | None = None  # an imported checkpoint's (service/runtime/chat_template_spec.py)
    # A multilingual translator's (config.json "languages": code -> token id; "forced_bos_token_id": the target
    # language when a request names none). Empty: the model translates one fixed direction.
    languages: dict[str, int] = field(default_factory=dict)
    forced_bos_token_id: int | None = None

    @property
    def n_heads(self) -> int:
        return self.dims["n_heads"]

    @property
    def end_tokens(self) -> tuple[int, ...]:
        """Every token that ends a generation (special_tokens.eos unless eos_token_ids lists them)."""
        return self.eos_token_ids or (self.special_tokens["eos"],)

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer: what the KV cache holds (fewer than n_heads with grouped-query
        attention; config.json states dims.n_kv_heads only then)."""
        return self.dims.get("n_kv_heads", self.dims["n_heads"])

    @property
    def d_head(self) -> int:
        return self.dims["d_head"]

    @property
    def n_decoder_layers(self) -> int:
        """Layers that carry a KV cache (decoder-only: all of them)."""
        return self.contract.cache_layers(self.dims)

    @property
    def contract(self) -> Task:
        """What the contract says about artifacts of this task (graph roles and names)."""
        return TASKS[self.task]

    def load_tokenizer(self) -> Tokenizer:
        try:
            return load_served_tokenizer(self.tokenizer_file)
        except Exception as exc:  # the Rust error says what is wrong, not where: add the file
            detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise ArtifactError(f"{self.tokenizer_file}: cannot load the tokenizer ({detail})") from None


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise ArtifactError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        raise ArtifactError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _tensors(items: list[Any], where: str) -> tuple[TensorSpec, ...]:
    specs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ArtifactError(f"{where}[{i}]: expected an object")
        shape = tuple(_require(item, "shape", list, f"{where}[{i}]"))
        default = item.get("default")
        if default is not None and not isinstance(default, int):
            raise ArtifactError(f"{where}[{i}]: default must be an integer")
        name = _require(item, "name", str, f"{where}[{i}]")
        specs.append(TensorSpec(name, str(item.get("dtype", "")), shape, default))
    return tuple(specs)


def _graph(folder: Path, role: str, data: dict[str, Any], where: str) -> GraphSpec:
    file = folder / _require(data, "file", str, where)
    if not file.is_file():
        raise ArtifactError(f"{where}: graph file {file} does not exist")
    int8_name = data.get("int8_file")
    int8_file = folder / int8_name if isinstance(int8_name, str) else None
    if int8_file is not None and not int8_file.is_file():
        raise ArtifactError(f"{where}: int8_file {int8_file} does not exist")
    return GraphSpec(
        role=role,
        file=file,
        int8_file=int8_file,
        inputs=_tensors(_require(data, "inputs", list, where), f"{where}.inputs"),
        outputs=_tensors(_require(data, "outputs", list, where), f"{where}.outputs"),
    )


def _generation_defaults(value: Any, where: str) -> dict[str, Any]:
    """config.json's generation_defaults, each within the range a request may state (GENERATION_DEFAULTS)."""
    if not isinstance(value, dict) or set(value) - set(GENERATION_DEFAULTS):
        raise ArtifactError(f"{where}: generation_defaults must be an object of {', '.join(GENERATION_DEFAULTS)}")
    for name, default in value.items():
        kind, low, high, low_allowed = GENERATION_DEFAULTS[name]
        number = isinstance(default, (int, float)) and not isinstance(default, bool)
        if (
            not number
            or (kind is int and not isinstance(default, int))
            or not (low <= default <= high if low_allowed else low < default <= high)
        ):
            article = "an integer" if kind is int else "a number"
            raise ArtifactError(
                f"{where}: generation_defaults.{name} must be {article} "
                f"in {'[' if low_allowed else '('}{low:g}, {high:g}], not {default!r}"
            )
    return dict(value)


def _decoding_fields(folder: Path, data: dict[str, Any], where: str) -> dict[str, Any]:
    """What an imported checkpoint adds to how its model decodes (Artifact's fields of the same names):
    end tokens and banned tokens, sampling defaults, a multilingual translator's languages, a chat template."""
    vocab = _require(data, "vocab_size", int, where)
    eos_token_ids = data.get("eos_token_ids", [])
    if not isinstance(eos_token_ids, list) or not all(isinstance(t, int) and 0 <= t < vocab for t in eos_token_ids):
        raise ArtifactError(f"{where}: eos_token_ids must be a list of token ids below vocab_size")
    bad_words = data.get("bad_words_ids", [])
    if not isinstance(bad_words, list) or not all(
        isinstance(w, list) and len(w) == 1 and isinstance(w[0], int) and 0 <= w[0] < vocab for w in bad_words
    ):
        raise ArtifactError(f"{where}: bad_words_ids must be single-token lists ([[id], ...]) below vocab_size")
    languages = data.get("languages", {})
    if not isinstance(languages, dict) or not all(isinstance(t, int) and 0 <= t < vocab for t in languages.values()):
        raise ArtifactError(f"{where}: languages must map language codes to token ids below vocab_size")
    forced_bos = data.get("forced_bos_token_id")
    if forced_bos is not None and forced_bos not in languages.values():
        raise ArtifactError(f"{where}: forced_bos_token_id must be one of the languages' tokens")
    chat_template = None
    if data.get(CHAT_TEMPLATE) is not None:
        try:
            chat_template = parse_chat_template(folder, data[CHAT_TEMPLATE], where)
        except ValueError as exc:
            raise ArtifactError(str(exc)) from None
    return {
        "eos_token_ids": tuple(eos_token_ids),
        "banned_token_ids": tuple(w[0] for w in bad_words),
        "generation_defaults": _generation_defaults(data.get("generation_defaults", {}), where),
        "languages": dict(languages),
        "forced_bos_token_id": forced_bos,
        "chat_template": chat_template,
    }


def load_artifact(folder: Path) -> Artifact:
    """Read `folder/config.json` and check it against the contract; raise ArtifactError naming the problem."""
    data = _read_json_object(folder / "config.json", "config.json")
    where = str(folder / "config.json")
    contract, architecture = _contract_of(data, where)
    dims = _dims(data, contract, where)
    specials = _require(data, "special_tokens", dict, where)
    for key in contract.special_tokens:
        if not isinstance(specials.get(key), int):
            raise ArtifactError(f"{where}: special_tokens.{key} is required for {contract.name}")
    labels: tuple[str, ...] = ()
    if contract.labels:
        labels = tuple(_require(data, "labels", list, where))
        if not labels:
            raise ArtifactError(f"{where}: labels must not be empty")
    graphs = _graphs(folder, data, contract, dims, where)
    tokenizer_file = folder / str(data.get("tokenizer", "tokenizer.json"))
    if not tokenizer_file.is_file():
        raise ArtifactError(f"{where}: tokenizer file {tokenizer_file} is missing")
    card_path = folder / str(data.get("card", "card.json"))
    card = _read_json_object(card_path, "the model card") if card_path.is_file() else {}
    try:
        golden = read_golden(folder)
    except ValueError as exc:
        raise ArtifactError(f"{folder / GOLDEN_FILE}: {exc}") from None
    return Artifact(
        folder=folder,
        name=_require(data, "name", str, where),
        task=contract.name,
        architecture=architecture,
        dims={k: v for k, v in dims.items() if isinstance(v, int)},
        vocab_size=_require(data, "vocab_size", int, where),
        max_positions=_require(data, "max_positions", int, where),
        special_tokens={k: v for k, v in specials.items() if isinstance(v, int)},
        labels=labels,
        graphs=graphs,
        tokenizer_file=tokenizer_file,
        card=card,
        golden=golden,
        **_encoder_fields(data, where),
        **_decoding_fields(folder, data, where),
    )


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read {what} ({exc})") from None
    if not isinstance(data, dict):
        if what != "config.json":
            return {}  # a card that is not an object is no card
        raise ArtifactError(f"{path}: expected a JSON object")
    return data


def _contract_of(data: dict[str, Any], where: str) -> tuple[Task, str]:
    """The format version, task and architecture: what the rest of config.json is checked against."""
    version = _require(data, "format_version", int, where)
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{where}: format_version {version} is not supported (expected {FORMAT_VERSION})")
    task = _require(data, "task", str, where)
    if task not in TASKS:
        raise ArtifactError(f"{where}: unknown task {task!r}")
    contract = TASKS[task]
    architecture = _require(data, "architecture", str, where)
    if architecture != contract.architecture:
        raise ArtifactError(
            f"{where}: task {task!r} needs architecture {contract.architecture!r}, got {architecture!r}"
        )
    return contract, architecture


def _dims(data: dict[str, Any], contract: Task, where: str) -> dict[str, Any]:
    dims: dict[str, Any] = _require(data, "dims", dict, where)
    for key in ("n_heads", "d_head", *contract.layer_dims):
        if not isinstance(dims.get(key), int) or dims[key] <= 0:
            raise ArtifactError(f"{where}: dims.{key} must be a positive integer")
    kv_heads = dims.get("n_kv_heads", dims["n_heads"])
    if not isinstance(kv_heads, int) or kv_heads <= 0 or dims["n_heads"] % kv_heads:
        raise ArtifactError(f"{where}: dims.n_kv_heads must be a positive integer dividing dims.n_heads")
    return dims


def _graphs(
    folder: Path, data: dict[str, Any], contract: Task, dims: dict[str, Any], where: str
) -> dict[str, GraphSpec]:
    """Each graph role the task needs, with the inputs and outputs the contract names."""
    graphs_data = _require(data, "graphs", dict, where)
    graphs = {}
    for role in contract.roles:
        if role not in graphs_data:
            raise ArtifactError(f"{where}: graphs.{role} is required for {contract.name}")
        graph = _graph(folder, role, graphs_data[role], f"{where}: graphs.{role}")
        io = contract.graph_io(role, dims)  # attention outputs and optional inputs may be absent
        missing = [n for n in io.inputs if n not in graph.input_names] + [
            n for n in io.outputs if n not in graph.output_names
        ]
        if missing:
            raise ArtifactError(f"{where}: graphs.{role} lacks {missing}")
        graphs[role] = graph
    return graphs


def _encoder_fields(data: dict[str, Any], where: str) -> dict[str, Any]:
    """An embedder's pooling and normalisation, and the package that holds a model's weights, if any."""
    for key in ("normalize", "dimensions_truncatable"):
        if not isinstance(data.get(key, False), bool):
            raise ArtifactError(f"{where}: field {key!r} must be true or false")
    pooling = data.get("pooling")
    if pooling is not None and pooling not in POOLING_MODES:
        raise ArtifactError(f"{where}: pooling must be one of {', '.join(POOLING_MODES)}, not {pooling!r}")
    weights_package = None
    if WEIGHTS_PACKAGE in data:
        try:
            weights_package = parse_weights_package(data[WEIGHTS_PACKAGE], where)
        except ValueError as exc:
            raise ArtifactError(str(exc)) from None
    return {
        "pooling": pooling,
        "normalize": data.get("normalize", False),
        "dimensions_truncatable": data.get("dimensions_truncatable", False),
        "weights_package": weights_package,
    }
