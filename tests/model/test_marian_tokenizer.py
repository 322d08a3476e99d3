"""A Marian tokenizer with different SentencePiece models for its two sides (as OPUS-MT ships them) over one
shared vocab.json: our converted tokenizer.json encodes source text as MarianTokenizer does, and decodes
target ids (pieces only the target model has included) as it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.importing.hf_tokenizer import load_tokenizer

ENGLISH = [
    "Where is the train station?", "I would like a cup of coffee, please.", "The server returned an error.",
    "Open the file and save your changes.", "The weather is nice today, isn't it?", "Close the window now.",
    "Please restart the application to apply the update.", "How much does this book cost?",
]
FRENCH = [
    "Où est la gare ?", "Je voudrais une tasse de café, s'il vous plaît.", "Le serveur a renvoyé une erreur.",
    "Ouvrez le fichier et enregistrez vos modifications.", "Il fait beau aujourd'hui, n'est-ce pas ?",
    "Fermez la fenêtre maintenant.", "Veuillez redémarrer l'application pour appliquer la mise à jour.",
    "Combien coûte ce livre ?",
]


def train_spm(corpus: list[str], prefix: Path) -> bytes:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus * 4), model_prefix=str(prefix), vocab_size=120,
                                   model_type="unigram", hard_vocab_limit=False, eos_id=0, unk_id=1, bos_id=-1,
                                   pad_id=-1, minloglevel=2)
    return Path(f"{prefix}.model").read_bytes()


@pytest.fixture(scope="module")
def opus_style_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sentencepiece as spm

    folder = tmp_path_factory.mktemp("opus-style")
    models = {"source.spm": train_spm(ENGLISH, folder / "en"), "target.spm": train_spm(FRENCH, folder / "fr")}
    vocab: dict[str, int] = {}
    for name, model in models.items():
        (folder / name).write_bytes(model)
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}))
    return folder


def test_sides_with_their_own_sentencepiece_models_encode_and_decode_as_marian(opus_style_folder: Path) -> None:
    from transformers import MarianTokenizer

    assert (opus_style_folder / "source.spm").read_bytes() != (opus_style_folder / "target.spm").read_bytes()
    slow = MarianTokenizer(str(opus_style_folder / "source.spm"), str(opus_style_folder / "target.spm"),
                           str(opus_style_folder / "vocab.json"))
    ours = load_tokenizer(opus_style_folder, "marian")
    for text in [*ENGLISH, "An unseen sentence about trains and coffee."]:
        assert ours.encode(text).ids == slow(text)["input_ids"], text
    target_only = set(json.loads((opus_style_folder / "vocab.json").read_text())) - {
        slow.spm_source.id_to_piece(i) for i in range(slow.spm_source.get_piece_size())}
    assert target_only, "the two sides should have pieces of their own"
    decoded_target_only = 0
    for text in FRENCH:
        ids = slow(text_target=text)["input_ids"]
        decoded_target_only += sum(slow.convert_ids_to_tokens(i) in target_only for i in ids)
        assert ours.decode(ids, skip_special_tokens=True) == slow.decode(ids, skip_special_tokens=True), text
    assert decoded_target_only > 0  # the decoding above did meet pieces the source side lacks
