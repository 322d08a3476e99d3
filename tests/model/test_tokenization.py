"""Tiny tokenizers trained in-test: round trips, special ids, templates."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from model.training.tokenization import (
    CLASSIFIER_IDS,
    GENERATOR_IDS,
    TRANSLATOR_IDS,
    train_classifier_tokenizer,
    train_generator_tokenizer,
    train_translator_tokenizer,
)

FRENCH = "Où est l'élève ? Il a déjà mangé à la crèche, naïf garçon « bien sûr »."
ENGLISH = "Where is the student? He has already eaten at the nursery, naive boy, of course."
CORPUS = [FRENCH, ENGLISH, "Le cœur a ses raisons. The heart has its reasons.", "Ça va très bien, merci !"] * 4


@pytest.fixture(scope="module")
def translator() -> Tokenizer:
    return train_translator_tokenizer(CORPUS, vocab_size=250)


@pytest.mark.parametrize("text", [FRENCH, ENGLISH, "Noël, où êtes-vous ? L'œuvre est là."])
def test_translator_round_trip(translator: Tokenizer, text: str) -> None:
    assert translator.decode(translator.encode(text).ids) == text


def test_translator_special_ids_and_eos(translator: Tokenizer) -> None:
    ids = TRANSLATOR_IDS
    for token, key in [("<pad>", "pad"), ("<unk>", "unk"), ("<s>", "bos"), ("</s>", "eos")]:
        assert translator.token_to_id(token) == ids[key]
    assert translator.encode(ENGLISH).ids[-1] == ids["eos"]
    assert ids["eos"] not in translator.encode(ENGLISH, add_special_tokens=False).ids


def test_translator_keeps_case_and_accents(translator: Tokenizer) -> None:
    tokens = "".join(translator.encode("Élève ÇA", add_special_tokens=False).tokens)
    assert "É" in tokens and "Ç" in tokens


def test_classifier_pair_template() -> None:
    tokenizer = train_classifier_tokenizer(["A great movie.", "The worst film ever!", ENGLISH] * 5, vocab_size=200)
    ids = CLASSIFIER_IDS
    assert [tokenizer.token_to_id(t) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]] == [0, 1, 2, 3, 4]
    single = tokenizer.encode("Great movie")
    assert single.tokens == ["[CLS]", "great", "movie", "[SEP]"]
    pair = tokenizer.encode("Great movie", "Worst film")
    assert pair.ids[0] == ids["cls"] and pair.ids[3] == ids["sep"] and pair.ids[-1] == ids["sep"]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]


def test_generator_byte_level_round_trip() -> None:
    tokenizer = train_generator_tokenizer([ENGLISH, FRENCH, "hello world " * 3], vocab_size=300)
    assert tokenizer.token_to_id("<pad>") == 0 and tokenizer.token_to_id("<|endoftext|>") == 1
    text = "Emoji 🤖🎉, accents: déjà vu, naïve Zoë.\n\n  Tabs\tand spaces."
    encoding = tokenizer.encode(text)
    assert tokenizer.decode(encoding.ids) == text
    assert GENERATOR_IDS["eos"] not in encoding.ids
    assert tokenizer.encode("a<|endoftext|>b").ids[1] == GENERATOR_IDS["eos"]
