"""Small random Hugging Face checkpoints built with ``transformers`` from configs (no download).

One per family the importer supports, each with a real tokenizer trained on a few sentences:
BERT (sequence classification, WordPiece from vocab.txt alone), GPT-2 (byte-level BPE), Marian (a SentencePiece model
only, which the importer must convert), BART (byte-level BPE with BART's special tokens).
Every weight gets noise on top of its initialization, so LayerNorm gains, biases and the final
logits bias are all distinct and a wrong mapping cannot hide behind ones and zeros.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

if TYPE_CHECKING:
    from transformers import BertConfig, PreTrainedTokenizerBase

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


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """The id of one token (``convert_tokens_to_ids`` is typed for a list of tokens too)."""
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int), (token, found)
    return found


def byte_level_bpe(folder: Path, specials: list[str], vocab_size: int = 300) -> None:
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(CORPUS, vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tokenizer.save_model(str(folder))  # vocab.json + merges.txt


def build_bert(folder: Path) -> None:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS, vocab_size=200, show_progress=False)
    wordpiece.save_model(str(folder))  # vocab.txt
    tokenizer = BertTokenizer.from_pretrained(str(folder))  # reads vocab.txt
    tokenizer.save_pretrained(str(folder))
    (folder / "tokenizer.json").unlink()  # vocab files only: the importer has to build tokenizer.json
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=SIZES["d_model"],
                        num_attention_heads=SIZES["heads"], intermediate_size=SIZES["ffn"],
                        num_hidden_layers=SIZES["layers"], max_position_embeddings=SIZES["positions"],
                        id2label={0: "negative", 1: "neutral", 2: "positive"},
                        label2id={"negative": 0, "neutral": 1, "positive": 2})
    model = BertForSequenceClassification(config)
    perturb(model)
    model.save_pretrained(str(folder))


def build_gpt2(folder: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    byte_level_bpe(folder, ["<|endoftext|>"])
    tokenizer = GPT2Tokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    tokenizer.save_pretrained(str(folder))
    eos = token_id(tokenizer, "<|endoftext|>")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=SIZES["positions"], n_embd=SIZES["d_model"],
                        n_layer=SIZES["layers"], n_head=SIZES["heads"], bos_token_id=eos, eos_token_id=eos)
    model = GPT2LMHeadModel(config)
    perturb(model)
    model.save_pretrained(str(folder))


def build_marian(folder: Path) -> None:
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(folder / "spm"), vocab_size=100, model_type="unigram",
        hard_vocab_limit=False, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, minloglevel=2,
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
    ids = {t: token_id(tokenizer, t) for t in ("<s>", "<pad>", "</s>")}
    config = BartConfig(vocab_size=len(tokenizer), d_model=SIZES["d_model"], encoder_layers=SIZES["layers"],
                        decoder_layers=SIZES["layers"], encoder_attention_heads=SIZES["heads"],
                        decoder_attention_heads=SIZES["heads"], encoder_ffn_dim=SIZES["ffn"],
                        decoder_ffn_dim=SIZES["ffn"], max_position_embeddings=SIZES["positions"],
                        bos_token_id=ids["<s>"], pad_token_id=ids["<pad>"], eos_token_id=ids["</s>"],
                        decoder_start_token_id=ids["</s>"], forced_eos_token_id=None)
    model = BartForConditionalGeneration(config)
    perturb(model)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape) * 0.1)
    model.save_pretrained(str(folder))


BUILDERS = {"bert": build_bert, "gpt2": build_gpt2, "marian": build_marian, "bart": build_bart}
# The families with one checkpoint each here; RoBERTa, XLM-RoBERTa and DistilBERT come in ENCODER_CHECKPOINTS.
FAMILIES = tuple(sorted(BUILDERS))


def build_checkpoint(family: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    BUILDERS[family](folder)
    return folder


# --- the encoder families beside BERT, and encoder checkpoints of each import rule ----------------------------

ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids 0..4
# Encoder checkpoints (tests/model/test_hf_encoders.py): name -> what it imports as.
ENCODER_CHECKPOINTS = {
    "roberta": "classification",  # RobertaForSequenceClassification, byte-level BPE
    "xlm-roberta": "classification",  # XLMRobertaForSequenceClassification, a Unigram tokenizer.json
    "distilbert": "classification",  # DistilBertForSequenceClassification, WordPiece
    "cross-encoder": "classification",  # BertForSequenceClassification with one label: a relevance score
    "sentence-transformer": "embedding",  # a BertModel with modules.json, 1_Pooling (mean) and Normalize
    "roberta-base": "embedding",  # a RobertaModel without a classification head
}


class EncoderSizes(TypedDict):
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    num_hidden_layers: int


def encoder_sizes() -> EncoderSizes:
    return {"hidden_size": SIZES["d_model"], "num_attention_heads": SIZES["heads"],
            "intermediate_size": SIZES["ffn"], "num_hidden_layers": SIZES["layers"]}


def roberta_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    from transformers import RobertaTokenizerFast

    byte_level_bpe(folder, ROBERTA_SPECIALS)
    tokenizer = RobertaTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def build_roberta(folder: Path, head: bool = True) -> None:
    from transformers import RobertaConfig, RobertaForSequenceClassification, RobertaModel

    tokenizer = roberta_tokenizer(folder)
    config = RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=SIZES["positions"] + 2,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                           id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
                           **encoder_sizes())
    model = RobertaForSequenceClassification(config) if head else RobertaModel(config)
    perturb(model)
    model.save_pretrained(str(folder))


def unigram_tokenizer_json(folder: Path) -> PreTrainedTokenizerBase:
    """An XLM-R-shaped SentencePiece Unigram tokenizer built with the tokenizers library (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaTokenizer

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", show_progress=False)
    unigram.train_from_iterator(CORPUS, trainer)
    unigram.add_special_tokens(["<mask>"])
    unigram.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = XLMRobertaTokenizer(tokenizer_object=unigram, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                        cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def build_xlm_roberta(folder: Path) -> None:
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    tokenizer = unigram_tokenizer_json(folder)
    config = XLMRobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=SIZES["positions"] + 2,
                              pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                              id2label={0: "negative", 1: "neutral", 2: "positive"},
                              label2id={"negative": 0, "neutral": 1, "positive": 2}, **encoder_sizes())
    model = XLMRobertaForSequenceClassification(config)
    perturb(model)
    model.save_pretrained(str(folder))


def wordpiece_tokenizer(folder: Path, tokenizer_class: type[PreTrainedTokenizerBase]) -> PreTrainedTokenizerBase:
    from tokenizers import BertWordPieceTokenizer

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS, vocab_size=200, show_progress=False)
    wordpiece.save_model(str(folder))  # vocab.txt
    tokenizer: PreTrainedTokenizerBase = tokenizer_class.from_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def build_distilbert(folder: Path) -> None:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertTokenizerFast

    tokenizer = wordpiece_tokenizer(folder, DistilBertTokenizerFast)
    config = DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=SIZES["d_model"], n_heads=SIZES["heads"],
                              hidden_dim=SIZES["ffn"], n_layers=SIZES["layers"],
                              max_position_embeddings=SIZES["positions"],
                              id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    model = DistilBertForSequenceClassification(config)
    perturb(model)
    model.save_pretrained(str(folder))


def bert_config(tokenizer: PreTrainedTokenizerBase) -> BertConfig:
    from transformers import BertConfig

    return BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=SIZES["positions"], **encoder_sizes())


def build_cross_encoder(folder: Path) -> None:
    from transformers import BertForSequenceClassification, BertTokenizer

    tokenizer = wordpiece_tokenizer(folder, BertTokenizer)
    config = bert_config(tokenizer)
    config.num_labels = 1  # a relevance score
    model = BertForSequenceClassification(config)
    perturb(model)
    model.save_pretrained(str(folder))


SENTENCE_TRANSFORMER_MAX_LENGTH = 32


def build_sentence_transformer(folder: Path) -> None:
    """A BertModel in the folder's root with sentence-transformers' module files written by hand."""
    from transformers import BertModel, BertTokenizer

    tokenizer = wordpiece_tokenizer(folder, BertTokenizer)
    model = BertModel(bert_config(tokenizer))
    perturb(model)
    model.save_pretrained(str(folder))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": SIZES["d_model"], "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": SENTENCE_TRANSFORMER_MAX_LENGTH, "do_lower_case": False}))


ENCODER_BUILDERS: dict[str, Callable[[Path], None]] = {
    "roberta": build_roberta, "xlm-roberta": build_xlm_roberta, "distilbert": build_distilbert,
    "cross-encoder": build_cross_encoder, "sentence-transformer": build_sentence_transformer,
    "roberta-base": lambda folder: build_roberta(folder, head=False),
}


def build_encoder_checkpoint(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    ENCODER_BUILDERS[name](folder)
    return folder


# --- Llama-shaped decoders (tests/model/test_hf_llama.py) -----------------------------------------------------

LLAMA_SPECIALS = ["<s>", "</s>", "<pad>"]  # ids 0, 1, 2
# name -> (transformers config class, options): grouped-query attention throughout (4 query heads, 2 or 1
# key/value heads), every rope scaling type, tied and separate heads, each family's biases.
DECODER_CHECKPOINTS: dict[str, tuple[str, dict[str, object]]] = {
    "llama": ("LlamaConfig", {"num_key_value_heads": 2, "rope_theta": 500.0, "tie_word_embeddings": False}),
    "llama-linear": ("LlamaConfig", {"num_key_value_heads": 2, "tie_word_embeddings": True, "attention_bias": True,
                                     "mlp_bias": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama3": ("LlamaConfig", {"num_key_value_heads": 2, "rope_scaling": {
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2, "tie_word_embeddings": True, "rope_theta": 1000.0}),
    "mistral": ("MistralConfig", {"num_key_value_heads": 1, "sliding_window": None}),
}
# generation_config.json of the "llama" checkpoint: two end tokens and default sampling settings.
LLAMA_GENERATION = {"eos_token_id": [1, 2], "bos_token_id": 0, "do_sample": True, "temperature": 0.7, "top_p": 0.9,
                    "top_k": 20, "repetition_penalty": 1.05, "max_new_tokens": 12}


def llama_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer.json that starts every encoding with <s>, as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=LLAMA_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def build_decoder(name: str, folder: Path) -> Path:
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tokenizer = llama_tokenizer(folder)
    config_class, options = DECODER_CHECKPOINTS[name]
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), hidden_size=SIZES["d_model"], num_attention_heads=SIZES["heads"],
        intermediate_size=SIZES["ffn"], num_hidden_layers=SIZES["layers"], max_position_embeddings=SIZES["positions"],
        bos_token_id=0, eos_token_id=1, pad_token_id=None, rms_norm_eps=1e-5, **options)
    model = transformers.AutoModelForCausalLM.from_config(config)
    perturb(model)
    model.save_pretrained(str(folder))
    if name == "llama":
        (folder / "generation_config.json").write_text(json.dumps(LLAMA_GENERATION))
    return folder


# --- the multilingual translators: M2M100 (NLLB-200 is the same class) --------------------------------------

M2M_LANGUAGES = ["__en__", "__fr__", "__de__"]


def build_m2m100(folder: Path) -> None:
    """M2M100 with a byte-level BPE tokenizer.json whose language codes are added special tokens and whose
    template starts the source with its language, as M2M100's tokenizer does (English here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import M2M100Config, M2M100ForConditionalGeneration, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                  show_progress=False)
    bpe.train_from_iterator(CORPUS, trainer)
    bpe.add_special_tokens(M2M_LANGUAGES)
    ids = {t: bpe.token_to_id(t) for t in ("<s>", "<pad>", "</s>", "__en__")}
    bpe.post_processor = processors.TemplateProcessing(
        single="__en__ $A </s>", pair="__en__ $A $B </s>",
        special_tokens=[("__en__", ids["__en__"]), ("</s>", ids["</s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", additional_special_tokens=M2M_LANGUAGES)
    tokenizer.save_pretrained(str(folder))
    config = M2M100Config(vocab_size=bpe.get_vocab_size(), d_model=SIZES["d_model"], encoder_layers=SIZES["layers"],
                          decoder_layers=SIZES["layers"], encoder_attention_heads=SIZES["heads"],
                          decoder_attention_heads=SIZES["heads"], encoder_ffn_dim=SIZES["ffn"],
                          decoder_ffn_dim=SIZES["ffn"], max_position_embeddings=SIZES["positions"],
                          bos_token_id=ids["<s>"], pad_token_id=ids["<pad>"], eos_token_id=ids["</s>"],
                          decoder_start_token_id=ids["</s>"])  # the forced BOS is in generation_config.json
    model = M2M100ForConditionalGeneration(config)
    perturb(model)
    model.save_pretrained(str(folder))
    (folder / "generation_config.json").write_text(json.dumps({
        "decoder_start_token_id": ids["</s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"],
        "bos_token_id": ids["<s>"], "forced_bos_token_id": bpe.token_to_id("__fr__"), "max_length": 200,
        "num_beams": 5, "early_stopping": True}))


SEQ2SEQ_CHECKPOINTS: dict[str, Callable[[Path], None]] = {"m2m_100": build_m2m100}


def build_seq2seq(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    SEQ2SEQ_CHECKPOINTS[name](folder)
    return folder


def t5_tokenizer(folder: Path) -> dict[str, int]:
    """T5's special ids (pad 0, </s> 1, <unk> 2) on a Unigram tokenizer.json ending each text with </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    unigram.train_from_iterator([*CORPUS, "translate English to French: "], trainer)
    unigram.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                           special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=unigram, eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    tokenizer.save_pretrained(str(folder))
    return {"pad": 0, "eos": 1, "vocab": unigram.get_vocab_size()}


def build_t5(folder: Path, gated: bool) -> None:
    """T5 (ReLU, tied head rescaled by d_model**-0.5) or T5 v1.1 / Flan-T5 (gated GELU, untied head); 8 buckets
    up to distance 20 so that the short test texts reach the logarithmic buckets."""
    from transformers import T5Config, T5ForConditionalGeneration

    ids = t5_tokenizer(folder)
    # Options T5Config reads from its **kwargs (tie_word_embeddings sets how decoder outputs are scaled) but
    # leaves out of its typed signature.
    options: dict[str, Any] = {
        "tie_word_embeddings": not gated, "decoder_start_token_id": ids["pad"],
        "task_specific_params": {"translation_en_to_fr": {"prefix": "translate English to French: "}}}
    config = T5Config(vocab_size=ids["vocab"], d_model=SIZES["d_model"], d_kv=SIZES["d_model"] // SIZES["heads"],
                      d_ff=SIZES["ffn"], num_layers=SIZES["layers"], num_decoder_layers=SIZES["layers"],
                      num_heads=SIZES["heads"], relative_attention_num_buckets=8, relative_attention_max_distance=20,
                      feed_forward_proj="gated-gelu" if gated else "relu", pad_token_id=ids["pad"],
                      eos_token_id=ids["eos"], **options)
    model = T5ForConditionalGeneration(config)
    # Larger noise than perturb's, and position biases that dominate the scores: a tiny T5 otherwise repeats
    # one token, and a wrong relative position would go unseen in what it generates.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.3)
            if "relative_attention_bias" in name:
                tensor.normal_(std=2.0, generator=generator)
        if gated:  # logits of a unit scale (the untied head reads unscaled states): tolerances stay absolute
            model.lm_head.weight.mul_(0.05)
    model.save_pretrained(str(folder))


SEQ2SEQ_CHECKPOINTS["t5"] = lambda folder: build_t5(folder, gated=False)
SEQ2SEQ_CHECKPOINTS["flan-t5"] = lambda folder: build_t5(folder, gated=True)
