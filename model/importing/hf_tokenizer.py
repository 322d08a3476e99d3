"""A checkpoint's tokenizer as one ``tokenizer.json`` (HF ``tokenizers``), and its special token ids.

A ``tokenizer.json`` in the folder is used as it is. A checkpoint that ships only a slow tokenizer
(SentencePiece, or vocab files) is converted by ``transformers``' own converters
(``convert_slow_tokenizer``); Marian, which has none there, gets the library's ``SpmConverter``
with the piece ids taken from Marian's ``vocab.json`` instead of the SentencePiece model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, processors

from model.families import DECODER_FAMILIES, ENCODER_FAMILIES, SEQ2SEQ_FAMILIES
from model.families.base import CheckpointError, special_token_names, token_id

__all__ = ["languages", "load_tokenizer", "special_token_names", "special_tokens", "token_id"]

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")


def load_tokenizer(folder: Path, family: str) -> Tokenizer:
    """The folder's tokenizer, without padding or truncation (the server sets its own limits)."""
    if (folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    else:
        tokenizer = convert_slow(folder, family)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def convert_slow(folder: Path, family: str) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
        from transformers.convert_slow_tokenizer import convert_slow_tokenizer
    except ImportError as exc:
        raise CheckpointError(
            f"{folder} has no tokenizer.json; converting its slow tokenizer needs transformers "
            "(pip install -e '.[import]')"
        ) from exc
    if family == "marian":
        return convert_marian(folder)
    try:
        slow = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as exc:
        found = sorted(p.name for p in folder.iterdir())
        raise CheckpointError(f"{folder}: no tokenizer.json and no tokenizer transformers can load ({exc}); "
                              f"found {found}") from exc
    backend = getattr(slow, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    try:
        return convert_slow_tokenizer(slow)
    except ValueError as exc:  # e.g. M2M100's SentencePiece tokenizer: transformers has no converter for it
        raise CheckpointError(f"{folder}: no tokenizer.json, and transformers cannot convert its "
                              f"{type(slow).__name__} into one ({exc})") from exc


def convert_marian(folder: Path) -> Tokenizer:
    from transformers import MarianTokenizer
    from transformers.convert_slow_tokenizer import SpmConverter

    missing = [name for name in MARIAN_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: a Marian tokenizer needs {', '.join(MARIAN_FILES)}; missing {missing}")
    # OPUS-MT's source.spm and target.spm differ, over one shared vocab.json: the tokenizer segments with
    # source.spm (its scores; pieces only the target side has get a floor score, so the source side never
    # picks them) and numbers and decodes every piece of vocab.json, as MarianTokenizer does.
    slow = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"))
    if slow.separate_vocabs:
        raise CheckpointError(f"{folder}: separate source and target vocabularies are not supported")

    class MarianConverter(SpmConverter):
        """SentencePiece segmentation as the library converts it; ids from Marian's vocab.json."""

        def __init__(self, original: Any) -> None:
            original.vocab_file = original.spm_files[0]  # what SpmConverter reads the model from
            SpmConverter.__init__(self, original)

        def vocab(self, proto: Any) -> list[tuple[str, float]]:
            scores = {p.piece: p.score for p in proto.pieces}
            floor = min(scores.values()) - 10.0  # pieces SentencePiece lacks (<pad>, >>xx<<) are never chosen
            by_id = sorted(self.original_tokenizer.encoder.items(), key=lambda item: item[1])
            if [i for _, i in by_id] != list(range(len(by_id))):
                raise CheckpointError(f"{folder}/vocab.json: ids are not 0..{len(by_id) - 1}")
            return [(piece, scores.get(piece, floor)) for piece, _ in by_id]

        def unk_id(self, proto: Any) -> int:
            return int(self.original_tokenizer.encoder[str(self.original_tokenizer.unk_token)])

        def post_processor(self) -> processors.TemplateProcessing:
            eos = str(self.original_tokenizer.eos_token)
            eos_id = self.original_tokenizer.encoder[eos]
            return processors.TemplateProcessing(single=["$A", eos], pair=["$A", "$B", eos],
                                                 special_tokens=[(eos, eos_id)])

    tokenizer = MarianConverter(slow).converted()
    tokenizer.add_special_tokens([str(slow.pad_token), str(slow.eos_token), str(slow.unk_token)])
    tokenizer.add_tokens(slow.supported_language_codes)  # ">>fra<<" target codes stay one token, as in Marian
    return tokenizer


def special_tokens(folder: Path, family: str, hf: dict[str, Any], tokenizer: Tokenizer) -> dict[str, int]:
    """The ids config.json's ``special_tokens`` needs for this family (see artifacts/README.md)."""
    if family in ENCODER_FAMILIES:
        return ENCODER_FAMILIES[family].special_tokens(folder, hf, tokenizer)
    if family in DECODER_FAMILIES:
        return DECODER_FAMILIES[family].special_tokens(folder, hf, tokenizer)
    return SEQ2SEQ_FAMILIES[family].special_tokens(folder, hf, tokenizer)


def languages(family: str, tokenizer: Tokenizer) -> dict[str, int]:
    """A multilingual translator's language codes (code -> token id); empty for every other family."""
    return SEQ2SEQ_FAMILIES[family].languages(tokenizer) if family in SEQ2SEQ_FAMILIES else {}
