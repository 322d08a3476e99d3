"""A tiny random GPT-2 checkpoint that carries a ChatML chat template in its tokenizer_config.json, as
Qwen-style chat checkpoints do: <|im_start|> and <|im_end|> are special tokens, <|im_end|> ends a turn."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.chat_templates import CHATML
from tests.hf_checkpoints import SIZES, byte_level_bpe, perturb, token_id

NAME = "chat"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_chat_checkpoint(name: str, folder: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    byte_level_bpe(folder, SPECIALS)
    tokenizer = GPT2Tokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tokenizer.save_pretrained(str(folder))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHATML  # where most Hub checkpoints keep it
    config_path.write_text(json.dumps(config, indent=2))
    ids = {t: token_id(tokenizer, t) for t in SPECIALS}
    gpt2 = GPT2Config(vocab_size=len(tokenizer), n_positions=SIZES["positions"] * 2, n_embd=SIZES["d_model"],
                      n_layer=SIZES["layers"], n_head=SIZES["heads"], bos_token_id=ids["<|endoftext|>"],
                      eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    model = GPT2LMHeadModel(gpt2)
    perturb(model)
    model.save_pretrained(str(folder))
    return folder
