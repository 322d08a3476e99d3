"""Small random Hugging Face checkpoints built with ``transformers`` from configs (no download).

One per family the importer supports, each with a real tokenizer trained on a few sentences:
BERT (sequence classification, WordPiece from vocab.txt alone), GPT-2 (byte-level BPE), Marian (a SentencePiece model
only, which the importer must convert), BART (byte-level BPE with BART's special tokens).
Every weight gets noise on top of its initialization, so LayerNorm gains, biases and the final
logits bias are all distinct and a wrong mapping cannot hide behind ones and zeros.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from service.contract.kinds import FAMILIES as REGISTRY_FAMILIES

FAMILIES = tuple(sorted(REGISTRY_FAMILIES))  # every Hugging Face family the importer reads
CORPUS = [
    "In the beginning God created the heavens and the earth.",
    "The movie was wonderful, a delight from start to finish.",
    "A dull, tedious and predictable story with no heart.",
    "Fellow citizens, the state of the union is strong.",
    "And God said, Let there be light: and there was light.",
    "The acting saves it, but the plot is thin and slow.",
    "We the people of the United States, in order to form a more perfect union.",
    "Le film était très ennuyeux, mais la fin est belle.",
] * 4
SIZES = {"d_model": 32, "heads": 4, "ffn": 64, "layers": 2, "positions": 64}


def perturb(model: torch.nn.Module, keep: str = "", seed: int = 0) -> None:
    """Noise on every float parameter except those whose name contains ``keep`` (fixed tables)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if not (keep and keep in name):
                tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.05)


def byte_level_bpe(folder: Path, specials: list[str], vocab_size: int = 300) -> None:
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(CORPUS, vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tokenizer.save_model(str(folder))  # vocab.json + merges.txt


def build_bert(folder: Path) -> None:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS, vocab_size=200, show_progress=False)
    wordpiece.save_model(str(folder))  # vocab.txt
    tokenizer = BertTokenizerFast.from_pretrained(str(folder))  # reads vocab.txt
    tokenizer.save_pretrained(str(folder))
    (folder / "tokenizer.json").unlink()  # vocab files only: the importer has to build tokenizer.json
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=SIZES["d_model"],
                        num_attention_heads=SIZES["heads"], intermediate_size=SIZES["ffn"],
                        num_hidden_layers=SIZES["layers"], max_position_embeddings=SIZES["positions"],
                        num_labels=3, id2label={0: "negative", 1: "neutral", 2: "positive"},
                        label2id={"negative": 0, "neutral": 1, "positive": 2})
    model = BertForSequenceClassification(config)
    perturb(model)
    model.save_pretrained(str(folder))


def build_gpt2(folder: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    byte_level_bpe(folder, ["<|endoftext|>"])
    tokenizer = GPT2TokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    tokenizer.save_pretrained(str(folder))
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=SIZES["positions"], n_embd=SIZES["d_model"],
                        n_layer=SIZES["layers"], n_head=SIZES["heads"], bos_token_id=eos, eos_token_id=eos)
    model = GPT2LMHeadModel(config)
    perturb(model)
    model.save_pretrained(str(folder))


def build_marian(folder: Path) -> None:
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(folder / "spm"), vocab_size=100, model_type="unigram", hard_vocab_limit=False,
        eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, minloglevel=2,
    )
    model_file = (folder / "spm.model").read_bytes()
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(model_file)
    for leftover in ("spm.model", "spm.vocab"):
        (folder / leftover).unlink()
    processor = spm.SentencePieceProcessor(model_proto=model_file)
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    vocab["<pad>"] = len(vocab)  # Marian puts <pad> last and starts decoding from it
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}))
    pad = vocab["<pad>"]
    config = MarianConfig(vocab_size=len(vocab), d_model=SIZES["d_model"], encoder_layers=SIZES["layers"],
                          decoder_layers=SIZES["layers"], encoder_attention_heads=SIZES["heads"],
                          decoder_attention_heads=SIZES["heads"], encoder_ffn_dim=SIZES["ffn"],
                          decoder_ffn_dim=SIZES["ffn"], max_position_embeddings=SIZES["positions"],
                          pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=None)
    model = MarianMTModel(config)
    perturb(model, keep="embed_positions")  # Marian's sinusoids are computed, not learned
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape) * 0.1)
    model.save_pretrained(str(folder))


def build_bart(folder: Path) -> None:
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizerFast

    byte_level_bpe(folder, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer = BartTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    tokenizer.save_pretrained(str(folder))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "<pad>", "</s>")}
    config = BartConfig(vocab_size=len(tokenizer), d_model=SIZES["d_model"], encoder_layers=SIZES["layers"],
                        decoder_layers=SIZES["layers"], encoder_attention_heads=SIZES["heads"],
                        decoder_attention_heads=SIZES["heads"], encoder_ffn_dim=SIZES["ffn"],
                        decoder_ffn_dim=SIZES["ffn"], max_position_embeddings=SIZES["positions"],
                        bos_token_id=ids["<s>"], pad_token_id=ids["<pad>"], eos_token_id=ids["</s>"],
                        decoder_start_token_id=ids["</s>"], forced_bos_token_id=None, forced_eos_token_id=None)
    model = BartForConditionalGeneration(config)
    perturb(model)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape) * 0.1)
    model.save_pretrained(str(folder))


BUILDERS = {"bert": build_bert, "gpt2": build_gpt2, "marian": build_marian, "bart": build_bart}


def build_checkpoint(family: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    BUILDERS[family](folder)
    return folder
