"""Our own model kinds, one record each: everything the data preparation, the trainer, the exporter and
the importer need to know about a kind (contract.kinds.KINDS names the trainable ones and their tasks for
the server). Adding a kind is one record here; nothing else keeps a table keyed by kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from torch import nn

from contract.kinds import EMBEDDING, KINDS, Task
from model.export import graphs
from model.network.classifier import Classifier
from model.network.config import ClassifierConfig, GeneratorConfig, TransformerConfig, TranslatorConfig
from model.network.embedder import Embedder
from model.network.generator import Generator
from model.network.translator import Translator
from model.training import tokenization

# (model, newest=True) -> the graphs to export; newest=False: those of artifacts exported before the optional
# inputs and outputs (the generator's logits_to_keep, the translator's scoring head)
GraphSpecs = Callable[..., list[graphs.GraphSpec]]
TokenizerTexts = Callable[[Path], Iterable[str]]  # the data dir -> the texts its tokenizer trains on


def translator_texts(data_dir: Path) -> Iterator[str]:
    """Each distinct English and French text of the translation train split's Bible and gettext rows.

    The registry sources (``parallel_sources``) are left out, so the translator's tokenizer is the
    one it was before they were added (the committed translator reuses it).
    """
    from model.data import read_jsonl
    from model.data.parallel_sources import PARALLEL_SOURCES

    seen: set[str] = set()
    for pair in read_jsonl(data_dir / "translation" / "train.jsonl"):
        if pair.get("source") in PARALLEL_SOURCES:
            continue
        for text in (pair["src"], pair["tgt"]):
            if text not in seen:
                seen.add(text)
                yield text


def generator_texts(data_dir: Path) -> Iterator[str]:
    """The documents of the generation train split."""
    from model.data.generation import read_documents

    return iter(read_documents(data_dir / "generation" / "train.txt"))


def pretrain_lines(data_dir: Path) -> Iterator[str]:
    """Non-empty lines of the classifier's pretraining corpus (it holds the train snippets)."""
    with (data_dir / "classification" / "pretrain.txt").open(encoding="utf-8") as f:
        yield from (line.rstrip("\n") for line in f if line.strip())


@dataclass(frozen=True)
class ModelKind:
    name: str
    task: Task
    network: type[nn.Module]
    graphs: GraphSpecs
    config: type[TransformerConfig] | None = None  # None: built from an imported checkpoint, never trained here
    special_tokens: dict[str, int] | None = None  # the ids its tokenizer trainer guarantees
    train_tokenizer: Callable[[Iterable[str], int], Tokenizer] | None = None
    tokenizer_texts: TokenizerTexts | None = None  # what that tokenizer trains on: train splits only
    stable_run: str | None = None  # its stable (warmup-stable-decay) run under runs/
    committed_run: str | None = None  # that run, packed, in artifacts/<kind>/: training continues from it
    pretraining_only: tuple[str, ...] = ()  # parameter prefixes of pretraining heads, never in the graphs

    def build(self, config: TransformerConfig) -> nn.Module:
        network: Any = self.network  # each network takes its own config class
        module: nn.Module = network(config)
        return module

    @property
    def trainable(self) -> bool:
        return self.config is not None


MODEL_KINDS: dict[str, ModelKind] = {
    kind.name: kind
    for kind in (
        ModelKind(
            "translator", KINDS["translator"].task, Translator, graphs.translator_specs, TranslatorConfig,
            tokenization.TRANSLATOR_IDS, tokenization.train_translator_tokenizer, translator_texts,
            stable_run="translator", committed_run="stable.safetensors",
        ),
        ModelKind(
            "generator", KINDS["generator"].task, Generator, graphs.generator_specs, GeneratorConfig,
            tokenization.GENERATOR_IDS, tokenization.train_generator_tokenizer, generator_texts,
            stable_run="generator", committed_run="stable.safetensors",
        ),
        ModelKind(
            "classifier", KINDS["classifier"].task, Classifier, graphs.classifier_specs, ClassifierConfig,
            tokenization.CLASSIFIER_IDS, tokenization.train_classifier_tokenizer, pretrain_lines,
            stable_run="classifier/pretrain", committed_run="pretrained.safetensors",  # its MLM + NSP pretraining
            pretraining_only=("mlm_transform.", "mlm_bias", "nsp_head."),
        ),
        ModelKind("embedder", EMBEDDING, Embedder, graphs.embedder_specs),
    )
}  # fmt: skip
TRAINABLE = tuple(name for name, kind in MODEL_KINDS.items() if kind.trainable)


def model_kind(name: str) -> ModelKind:
    try:
        return MODEL_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown model kind {name!r}; known: {', '.join(MODEL_KINDS)}") from None


def config_from_dict(data: dict[str, Any]) -> TransformerConfig:
    """A training config from its dict (config.json of a run, a card's "config"), named by its "kind"."""
    fields = dict(data)
    config = model_kind(fields.pop("kind")).config
    if config is None:
        raise ValueError(f"{data.get('kind')!r} is not trained here: it has no training config")
    return config(**fields)


def load_config(path: Path) -> TransformerConfig:
    return config_from_dict(json.loads(path.read_text()))
