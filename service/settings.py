"""Server settings: one `Settings` object read from `SERVE_*` environment variables, validated at start."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# With SERVE_MODELS unset every model folder is served, in this order (then the others by name). The first
# model of each task answers requests that name no model: classifier-minilm (pretrained, fine-tuned) scored
# better than classifier on validation (artifacts/classifier-minilm/card.md).
DISCOVERY_ORDER = ("translator", "generator", "classifier-minilm", "classifier")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a folder name: no path separators
DEFAULT_ARTIFACTS_DIR = Path(__file__).resolve().parent.parent / "artifacts"


class Settings(BaseSettings):
    # An empty variable (`SERVE_IO_BINDING=` in an env file, a compose pass-through set to "") is unset: the default.
    model_config = SettingsConfigDict(env_prefix="SERVE_", extra="forbid", validate_default=True, env_ignore_empty=True)

    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=1, le=65535)
    artifacts_dir: Path = DEFAULT_ARTIFACTS_DIR
    # Empty: every folder of artifacts_dir that has a config.json (DISCOVERY_ORDER first).
    models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # 0: one per usable CPU under a CPU limit (a container's), else ONNX Runtime's pick (one per physical core).
    intra_op_threads: int = Field(default=0, ge=0, le=256)
    inter_op_threads: int = Field(default=0, ge=0, le=256)
    # A classifier run that answers several requests at once uses this many (None: one fewer than the above,
    # or than the cores), leaving the event loop a core; a lone request gets them all.
    busy_intra_op_threads: int | None = Field(default=None, ge=1, le=256)
    quantization: Literal["none", "int8"] = "none"
    # None: bind outputs on the device only when the session really runs on CUDA.
    io_binding: bool | None = None
    # Decoders' cached self-attention as one fused node per layer (the same numbers; false: the graph as exported).
    fuse_attention: bool = True
    # ONNX Runtime's intra-op threads keep spinning after a run returns (false: they park as it returns;
    # unset: they spin unless the process runs under a CPU limit).
    spin_between_runs: bool | None = None
    # Once every model has been idle this long after work, the memory the work used goes back to the OS
    # (glibc's malloc_trim, with ONNX Runtime's arena off): RSS returns to about where it was before a burst.
    # 0: never, and the arena keeps what the largest batch used.
    memory_trim_idle_s: float = Field(default=1.0, ge=0, le=3600)

    # HTTP front-end processes: parsing, validation, tokenizing and rendering answers in N processes that
    # feed one engine process, which runs the models (1: everything in one process).
    api_processes: int = Field(default=1, ge=1, le=64)

    max_input_tokens: int = Field(default=512, ge=1, le=65536)
    max_new_tokens: int = Field(default=256, ge=1, le=65536)
    max_batch_size: int = Field(default=64, ge=1, le=1024)
    max_wait_ms: float = Field(default=0.0, ge=0, le=10_000)
    # While a batch decodes, newcomers' prompts are fed this many padded tokens per step (0: whole prompts).
    prefill_chunk_tokens: int = Field(default=64, ge=0, le=65536)
    max_queue_size: int = Field(default=256, ge=1, le=1_000_000)
    # Bytes each generator's key/value cache may take: its running sequences' worst case (prompt + new tokens)
    # plus its prefix store; a request waits in the queue until it fits (service/engine/cache/budget.py).
    # 0: half the memory limit (the cgroup's, else the machine's).
    kv_cache_bytes: int = Field(default=0, ge=0, le=1 << 44)
    # Reuse the cached keys and values of prompt prefixes seen before (service/engine/cache/prefix.py), in at
    # most this share of kv_cache_bytes; 0 turns it off.
    prefix_cache_fraction: float = Field(default=0.25, ge=0, le=1)
    request_timeout_s: float = Field(default=60.0, gt=0, le=86_400)

    api_key: SecretStr | None = None
    # With an API key set, /docs, /redoc and /openapi.json need it too unless this is true.
    public_docs: bool = False
    # false: /v1/models leaves out each model card (training command, library versions).
    model_details: bool = True
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=1 << 30)
    # A connection must send a request's whole header within this time (slow-header clients are closed).
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    # ... and its whole body within this time after the header (slow-body clients get a 408 and are closed).
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # Each send of a response must complete within this time (a client that stops reading is cut and its
    # request ended); nginx's send_timeout, 60 s.
    send_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    # An idle keep-alive connection is closed after this long. Longer than clients keep idle connections
    # pooled (httpx 5 s, aiohttp 15 s, nginx upstream 60 s), so a client never sends a request on a
    # connection the server is closing at that instant; 75 s is nginx's own client keep-alive timeout.
    keepalive_timeout_s: float = Field(default=75.0, gt=0, le=3600)
    # Attention maps cost items x layers x heads x tokens^2 numbers (about 8 bytes each as JSON): cap the total.
    max_attention_values: int = Field(default=1_048_576, ge=1, le=1 << 31)
    # ... and the maps of all requests in flight together (429 beyond): what a burst of them can make the server hold.
    max_attention_values_in_flight: int = Field(default=4_194_304, ge=1, le=1 << 34)
    # Chat templates run in a child process (service/engine/tasks/generation/template_sandbox.py): the
    # longest one compile or render may take, and the address space the child may use, in MiB.
    chat_template_timeout_s: float = Field(default=2.0, gt=0, le=600)
    chat_template_memory_mb: int = Field(default=512, ge=64, le=1 << 20)
    # Longest /tokenize answer and /detokenize input, in tokens (the body limit alone lets ~1M through).
    max_tokenize_tokens: int = Field(default=65_536, ge=1, le=1 << 24)
    warmup: bool = True
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    # Client compatibility and operations (docs/api.md and docs/operations.md).
    log_format: Literal["text", "json"] = "text"
    # A max_tokens / max_new_tokens beyond the model's context is clamped to what fits (finish_reason
    # "length"), as OpenAI-style clients expect; true makes it a 422 instead.
    strict_max_tokens: bool = False
    # Origins allowed to call the API from a browser ("*" for any); empty: no CORS headers at all.
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # A comment line on an idle event stream every this many seconds keeps proxies from closing it (0: off).
    sse_keepalive_s: float = Field(default=15.0, ge=0, le=3600)

    @field_validator("models", "cors_origins", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        """SERVE_MODELS and SERVE_CORS_ORIGINS are comma-separated; blank entries are dropped."""
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("models")
    @classmethod
    def _valid_model_names(cls, value: list[str]) -> list[str]:
        invalid = [name for name in value if not MODEL_NAME.fullmatch(name)]
        if invalid:
            raise ValueError(
                f"invalid model name(s) {invalid}: folder names in SERVE_ARTIFACTS_DIR (letters, digits, '.', '_', '-')"
            )
        return list(dict.fromkeys(value))

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_key")
    @classmethod
    def _non_empty_key(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None

    @model_validator(mode="after")
    def _one_request_fits_in_flight(self) -> Settings:
        if self.max_attention_values_in_flight < self.max_attention_values:
            raise ValueError(
                "max_attention_values_in_flight must be >= max_attention_values: "
                "a request at the per-request limit could never be served"
            )
        return self

    @model_validator(mode="after")
    def _model_folders_exist(self) -> Settings:
        if not self.models:
            self.models = discover_models(self.artifacts_dir)
        missing = [name for name in self.models if not (self.artifacts_dir / name / "config.json").is_file()]
        if missing:
            folders = ", ".join(str(self.artifacts_dir / name) for name in missing)
            raise ValueError(
                f"no artifact for {missing}: expected config.json in {folders}. "
                "Export the model there, point SERVE_ARTIFACTS_DIR at another folder, or narrow SERVE_MODELS."
            )
        return self


def discover_models(artifacts_dir: Path) -> list[str]:
    """Every model folder (one with a config.json) in ``artifacts_dir``: DISCOVERY_ORDER first, then by name."""
    found = [p.parent.name for p in artifacts_dir.glob("*/config.json") if MODEL_NAME.fullmatch(p.parent.name)]
    if not found:
        raise ValueError(
            f"no model folder (with a config.json) in {artifacts_dir}; export one there, "
            "or point SERVE_ARTIFACTS_DIR at another folder"
        )
    return sorted(
        found, key=lambda name: (DISCOVERY_ORDER.index(name) if name in DISCOVERY_ORDER else len(DISCOVERY_ORDER), name)
    )
