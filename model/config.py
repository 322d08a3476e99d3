"""One config dataclass per model, passed whole and saved as JSON next to the weights."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TransformerConfig:
    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 512
    activation: str = "relu"  # "relu" (paper) or "gelu" (GPT/BERT)
    learned_positions: bool = False  # sinusoidal (paper) by default
    special_tokens: dict[str, int] = field(default_factory=dict)

    kind = "transformer"

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


@dataclass
class TranslatorConfig(TransformerConfig):
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    label_smoothing: float = 0.1
    kind = "translator"


@dataclass
class GeneratorConfig(TransformerConfig):
    n_layers: int = 4
    activation: str = "gelu"
    kind = "generator"


@dataclass
class ClassifierConfig(TransformerConfig):
    n_layers: int = 4
    activation: str = "gelu"
    learned_positions: bool = True  # BERT learns its position embeddings
    type_vocab_size: int = 2
    labels: list[str] = field(default_factory=lambda: ["negative", "positive"])
    kind = "classifier"


CONFIG_CLASSES: dict[str, type[TransformerConfig]] = {
    cls.kind: cls for cls in (TranslatorConfig, GeneratorConfig, ClassifierConfig)
}


def load_config(path: Path) -> TransformerConfig:
    data = json.loads(path.read_text())
    cls = CONFIG_CLASSES[data.pop("kind")]
    return cls(**data)
