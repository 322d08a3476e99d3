"""Train the three HF ``tokenizers`` tokenizers; each is saved as one ``tokenizer.json``.

- translator: shared English+French BPE, NFC, Metaspace; ``encode(src)`` ends in ``</s>``.
- generator: byte-level BPE, lossless on any text; no template.
- classifier: lowercase WordPiece with the BERT ``[CLS] A [SEP] B [SEP]`` template.

Special tokens come first, in a fixed order, so their ids are the ones in
``*_IDS``; the trainers check this. model/kinds.py gives each kind its trainer and ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

TRANSLATOR_IDS = {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
GENERATOR_IDS = {"pad": 0, "eos": 1, "bos": 1}
CLASSIFIER_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
TRANSLATOR_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
GENERATOR_SPECIALS = ["<pad>", "<|endoftext|>"]
CLASSIFIER_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DEFAULT_VOCAB_SIZE = 8000

# Always in the translator's vocabulary, whatever the corpus: ASCII plus French letters and quotes.
_FRENCH = "àâäæçéèêëîïôöœùûüÿÀÂÄÆÇÉÈÊËÎÏÔÖŒÙÛÜŸ«»‘’“”…–—"
TRANSLATOR_ALPHABET = [chr(c) for c in range(33, 127)] + list(_FRENCH)


def _check_ids(tokenizer: Tokenizer, specials: list[str]) -> Tokenizer:
    """Fail unless the special tokens got ids 0, 1, 2, ... in order."""
    ids = [tokenizer.token_to_id(token) for token in specials]
    if ids != list(range(len(specials))):
        raise RuntimeError(f"special token ids {ids} for {specials}")
    return tokenizer


def train_translator_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Shared English+French BPE keeping case and accents; ``encode(x)`` appends ``</s>``."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=TRANSLATOR_SPECIALS,
        initial_alphabet=TRANSLATOR_ALPHABET, show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 3)])
    return _check_ids(tokenizer, TRANSLATOR_SPECIALS)


def train_generator_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Byte-level BPE (GPT-2 style, no prefix space): any text round-trips exactly."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=GENERATOR_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return _check_ids(tokenizer, GENERATOR_SPECIALS)


def train_classifier_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Lowercase, accent-stripping WordPiece with BERT single and pair templates."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=CLASSIFIER_SPECIALS,
        continuing_subword_prefix="##", show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    return _check_ids(tokenizer, CLASSIFIER_SPECIALS)
