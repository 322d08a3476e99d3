"""The models the anchor compares ours with, built from our artifacts' dimensions with random weights: each
Hugging Face reference (GPT-2, Marian, BERT), its CTranslate2 conversion, and our own random re-export."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.anchor_shapes import dims

REPO = Path(__file__).resolve().parent.parent


def export_random_weights(artifact: Path, out: Path) -> None:
    """Our model with the dims of `artifact` and random weights (its tokenizer), float32 and int8 graphs."""
    import torch

    from model.export.graphs import export_model
    from model.kinds import model_kind
    from model.training.checkpoint import artifact_config

    if (out / "config.json").is_file():
        return
    torch.manual_seed(0)
    model = model_kind(artifact.name).build(artifact_config(artifact))
    export_model(artifact.name, model, artifact / "tokenizer.json", out)


def link_served(artifact: Path, out: Path) -> None:
    """The served artifact itself, linked: an encoder's speed does not depend on its weights (and the
    embedder's weights come from a package)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_symlink() and out.resolve() != artifact.resolve():
        out.unlink()
    if not out.exists():
        out.symlink_to(artifact.resolve(), target_is_directory=True)


def gpt2(d: dict[str, Any]) -> Any:
    import transformers

    special = d["special_tokens"]
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=d["vocab_size"], n_positions=d["max_positions"], n_embd=d["d_model"], n_layer=d["n_layers"],
        n_head=d["n_heads"], n_inner=d["d_ff"], activation_function="gelu",
        bos_token_id=special["bos"], eos_token_id=special["eos"], pad_token_id=special["pad"]))


def marian_mt(d: dict[str, Any]) -> Any:
    """Marian's pad token is its last one (the converter drops it again: one row more than ours), and its
    zero embedding starts the decoder, as CTranslate2's start_from_zero_embedding does."""
    import transformers

    special = d["special_tokens"]
    return transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=d["vocab_size"] + 1, d_model=d["d_model"], encoder_layers=d["n_encoder_layers"],
        decoder_layers=d["n_decoder_layers"], encoder_attention_heads=d["n_heads"],
        decoder_attention_heads=d["n_heads"], encoder_ffn_dim=d["d_ff"], decoder_ffn_dim=d["d_ff"],
        max_position_embeddings=d["max_positions"], activation_function="relu", pad_token_id=d["vocab_size"],
        eos_token_id=special["eos"], bos_token_id=special["bos"], decoder_start_token_id=d["vocab_size"],
        forced_eos_token_id=None))


def bert_config(d: dict[str, Any]) -> Any:
    import transformers

    labels = range(d["labels"])  # as num_labels=labels would name them
    config = transformers.BertConfig(
        vocab_size=d["vocab_size"], hidden_size=d["d_model"], num_hidden_layers=d["n_layers"],
        num_attention_heads=d["n_heads"], intermediate_size=d["d_ff"], max_position_embeddings=d["max_positions"],
        type_vocab_size=2, id2label={i: f"LABEL_{i}" for i in labels}, label2id={f"LABEL_{i}": i for i in labels},
        pad_token_id=d["special_tokens"]["pad"])
    config.position_embedding_type = "absolute"  # transformers 5 dropped the field; CTranslate2 4.8 reads it
    return config


def bert_classifier(d: dict[str, Any]) -> Any:
    import transformers

    return transformers.BertForSequenceClassification(bert_config(d))


def bert_encoder(d: dict[str, Any]) -> Any:
    """The encoder alone (CTranslate2's converter wants its pooler too); pooled in the engines."""
    import transformers

    return transformers.BertModel(bert_config(d))


def save_head(model: Any, hf_dir: Path) -> None:
    """CTranslate2 converts BertModel: the classifier's head, kept to apply it in numpy."""
    head = model.classifier
    np.savez(hf_dir / "head.npz", weight=head.weight.detach().numpy(), bias=head.bias.detach().numpy())


@dataclass(frozen=True)
class Reference:
    """How a model's Hugging Face reference is built from our dims and converted for CTranslate2."""

    model: Callable[[dict[str, Any]], Any]  # our dims -> a random transformers model
    marian: bool = False  # the converter's vocabulary gets Marian's `<pad>` last (convert)
    save: Callable[[Any, Path], None] | None = None  # what else the engines need beside the saved model


def build_reference(reference: Reference, artifact: Path, out: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer

    hf_dir, ct2_dir = out / "hf", out / "ct2"
    if (ct2_dir / "model.bin").is_file():
        return
    transformers.logging.set_verbosity_error()
    d = dims(artifact)
    raw = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    names = {f"{k}_token": raw.id_to_token(v) for k, v in d["special_tokens"].items()
             if k in ("pad", "eos", "bos", "unk", "cls", "sep", "mask")}
    names.setdefault("unk_token", names.get("eos_token", names["pad_token"]))  # CTranslate2 wants one
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(artifact / "tokenizer.json"), **names)
    torch.manual_seed(0)
    model = reference.model(d)
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    if reference.save is not None:
        reference.save(model, hf_dir)
    convert(hf_dir, ct2_dir, reference.marian)


def exporter_digest() -> str:
    """Of the sources an export depends on: a changed exporter or graph contract gets a fresh random export."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "model").rglob("*.py"), *(REPO / "service" / "contract").rglob("*.py")]):
        digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def convert(hf_dir: Path, ct2_dir: Path, marian: bool) -> None:
    """CTranslate2's TransformersConverter on a saved transformers model. For Marian, the vocabulary gets the
    `<pad>` the converter expects last (ours, at 0, is renamed)."""
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(str(hf_dir))
    if marian:
        load = converter.load_tokenizer
        converter.load_tokenizer = lambda *args, **kwargs: marian_vocabulary(load(*args, **kwargs))
    converter.convert(str(ct2_dir), force=True)


def marian_vocabulary(tokenizer: Any) -> _Vocabulary:
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    tokens = [("<ours:pad>" if t == "<pad>" else t) for t in tokens] + ["<pad>"]
    return _Vocabulary(tokenizer, {t: i for i, t in enumerate(tokens)})


class _Vocabulary:
    def __init__(self, tokenizer: Any, vocab: dict[str, int]) -> None:
        self._tokenizer, self._vocab = tokenizer, vocab

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)
