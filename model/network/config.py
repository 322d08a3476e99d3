"""One config dataclass per model, passed whole and saved as JSON next to the weights."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


@dataclass
class TransformerConfig:
    depth_fields: ClassVar[tuple[str, ...]] = ("n_layers",)  # the fields that say how many layers it has
    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 512
    # one of ACTIVATIONS: "relu" (paper), "gelu" (erf: BERT), "gelu_tanh" (GPT-2), "silu" (Marian)
    activation: str = "relu"
    learned_positions: bool = False  # sinusoidal (paper) by default
    special_tokens: dict[str, int] = field(default_factory=dict)
    # Options for checkpoints trained elsewhere (scripts/import_checkpoint.py); the defaults are our own models.
    norm_position: str = "pre"  # "pre": x + f(LN(x)), final LayerNorm; "post": LN(x + f(x)), none (BERT, Marian, BART)
    sinusoid_layout: str = "interleaved"  # sin/cos "interleaved" (paper) or "split": all sines, then cosines (Marian)
    position_offset: int = 0  # added to position ids before the lookup (BART's learned table starts at 2)
    scale_embeddings: bool = True  # token embeddings times sqrt(d_model) (paper); off for BERT, GPT-2, BART
    embedding_layer_norm: bool = False  # LayerNorm right after the embedding sum (BERT, BART)
    bias: bool = True  # biases of the attention and feed-forward projections
    layer_norm_eps: float = 1e-5
    tie_output: bool = True  # the LM head shares the token embedding matrix (translator, generator)
    final_logits_bias: bool = False  # a fixed-size learned bias added to the LM logits (Marian, BART)
    # Llama-family options (model/families/llama.py); the defaults are the layers above.
    norm: str = "layer"  # "layer": LayerNorm; "rms": RMSNorm (no mean, no bias)
    n_kv_heads: int | None = None  # grouped-query attention: key/value heads shared by query groups; None: n_heads
    rotary: bool = False  # rotary position embeddings on queries and keys, no position vectors added
    rope_theta: float = 10000.0  # the rotary base
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "linear" | "llama3", ...} as transformers names it
    gated_ff: bool = False  # gated feed-forward: down(act(gate(x)) * up(x)) (SwiGLU with "silu")
    qkv_bias: bool | None = None  # biases of the query/key/value projections; None: as `bias` (Qwen2: only these)
    out_bias: bool | None = None  # bias of the attention output projection; None: as `bias`
    ff_bias: bool | None = None  # biases of the feed-forward projections; None: as `bias`
    # T5 options (model/families/t5.py): scores without 1/sqrt(d_head), and a relative position bias
    # (model/network/relative_position.py) instead of position vectors when relative_buckets > 0.
    scale_attention: bool = True
    relative_buckets: int = 0
    relative_max_distance: int = 128

    kind = "transformer"

    def __post_init__(self) -> None:
        for name, allowed in (("activation", ACTIVATIONS), ("norm_position", ("pre", "post")),
                              ("sinusoid_layout", ("interleaved", "split", "fairseq")), ("norm", ("layer", "rms"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{type(self).__name__}.{name} must be one of {allowed}, got {getattr(self, name)!r}")

        if self.kv_heads <= 0 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: what the KV cache holds per layer."""
        return self.n_kv_heads or self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


@dataclass
class TranslatorConfig(TransformerConfig):
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    label_smoothing: float = 0.1
    separate_decoder_positions: bool = False  # the decoder has its own learned position table (BART)
    rescale_output: bool = False  # decoder states times d_model**-0.5 before the LM head (T5 with its tied head)
    # A multilingual checkpoint's (M2M100, NLLB): language code -> its token, and the token forced as the first
    # generated one when a request names no target language (generation_config.json's forced_bos_token_id).
    languages: dict[str, int] = field(default_factory=dict)
    forced_bos_token_id: int | None = None
    kind = "translator"
    depth_fields: ClassVar[tuple[str, ...]] = ("n_encoder_layers", "n_decoder_layers")


@dataclass
class GeneratorConfig(TransformerConfig):
    n_layers: int = 4
    activation: str = "gelu"
    # From an imported checkpoint's generation_config.json (model/importing/generation_config.py), written to
    # config.json:
    eos_token_ids: list[int] = field(default_factory=list)  # every end token; empty: special_tokens["eos"] alone
    generation_defaults: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, ..., max_new_tokens
    bad_words_ids: list[list[int]] = field(default_factory=list)  # single tokens never generated
    kind = "generator"


@dataclass
class ClassifierConfig(TransformerConfig):
    n_layers: int = 4
    activation: str = "gelu"
    learned_positions: bool = True  # BERT learns its position embeddings
    # Segment-embedding rows: 2 (BERT: a token_type_ids input), 1 (RoBERTa: the row is added to every token,
    # no input), 0 (DistilBERT: none).
    type_vocab_size: int = 2
    labels: list[str] = field(default_factory=lambda: ["negative", "positive"])
    scale_embeddings: bool = False
    embedding_layer_norm: bool = True
    pooler: bool = True  # BERT's pooler (dense + tanh on [CLS]) before the head; off: the head reads [CLS] itself
    pooler_activation: str = "tanh"  # "tanh" (BERT, RoBERTa's classifier.dense) or "relu" (DistilBERT's pre_classifier)
    # What the classification head reads: "cls" (the pooler on [CLS], as in BERT; NSP always reads it) or
    # "mean" (the mean of the final states over the real tokens, the pooler unused).
    pooling: str = "cls"
    kind = "classifier"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"ClassifierConfig.pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.pooler_activation not in ("tanh", "relu"):
            raise ValueError("ClassifierConfig.pooler_activation must be 'tanh' or 'relu', "
                             f"got {self.pooler_activation!r}")
