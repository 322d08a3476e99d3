"""The models the suite serves besides the committed artifacts: `chat`, a tiny random GPT-2 with a ChatML chat
template in its tokenizer_config.json (built with transformers and imported with model/importing, as a Hub
chat checkpoint would be), and `reranker`, the tiny one-label cross-encoder of model/export/tiny.py (/rerank
needs one). Built once per version of model/, contract/ and this file, and cached where the tests cache their
imported checkpoints (pytest's cache folder). Building needs the `train` extra (torch, transformers)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from harness.reliability.harness import ARTIFACTS, REPO

CHAT = "chat"
RERANKER = "reranker"
EXTRA_MODELS = (CHAT, RERANKER)
CACHE = REPO / ".pytest_cache" / "d" / "reliability-models"
TEMPLATE_FILE = "chat_template.jinja"  # where the import writes the checkpoint's template (config.json names it)

# Qwen2.5-style ChatML: a default system message when the conversation has none.
CHATML = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Where is the train station? It is on the left, past the bridge.",
    "You are a helpful assistant. Answer briefly and politely.",
    "In the beginning God created the heavens and the earth.",
    "The movie was wonderful, a delight from start to finish.",
    "Fellow citizens, the state of the union is strong.",
    "Thanks! What time does the museum open tomorrow morning?",
] * 4


def _digest() -> str:
    import tokenizers
    import transformers

    digest = hashlib.sha256(f"{transformers.__version__} {tokenizers.__version__}".encode())
    for path in sorted([*(REPO / "model").rglob("*.py"), *(REPO / "contract").rglob("*.py"), Path(__file__)]):
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_chat_checkpoint(folder: Path) -> Path:
    """A tiny random GPT-2 with a byte-level BPE tokenizer and CHATML in its tokenizer_config.json;
    <|im_end|> ends a turn (its eos)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, special_tokens=SPECIALS, show_progress=False)
    bpe.save_model(str(folder))  # vocab.json + merges.txt
    tokenizer = GPT2Tokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"),
                              bos_token=SPECIALS[0], eos_token=SPECIALS[2], pad_token=SPECIALS[0])  # fmt: skip
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tokenizer.save_pretrained(str(folder))
    (folder / TEMPLATE_FILE).unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHATML  # where most Hub checkpoints keep it
    config_path.write_text(json.dumps(config, indent=2))
    pad, eos = (tokenizer.convert_tokens_to_ids(t) for t in (SPECIALS[0], SPECIALS[2]))
    assert isinstance(pad, int) and isinstance(eos, int)
    gpt2 = GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=32, n_layer=2, n_head=4,
                      bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    model = GPT2LMHeadModel(gpt2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # noise on every weight: distinct gains and biases, as a trained model has
        for tensor in model.parameters():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.05)
    model.save_pretrained(str(folder))
    return folder


def _build(staging: Path) -> None:
    from model.export.tiny import export_tiny_artifacts
    from model.importing.hf_artifact import import_to_artifact

    with warnings.catch_warnings():  # the exporters' warnings are not about the suite
        warnings.simplefilter("ignore")
        checkpoint = build_chat_checkpoint(staging / "checkpoints" / CHAT)
        import_to_artifact(checkpoint, staging / CHAT, CHAT, int8=False)
        export_tiny_artifacts(staging, (RERANKER,))


def suite_models(cache: Path = CACHE) -> Path:
    """A folder holding the `chat` and `reranker` artifacts, built here on the first call of each source version."""
    folder = cache / _digest()
    if all((folder / name / "golden.json").is_file() for name in EXTRA_MODELS):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=cache))
    try:
        _build(staging)
        for stale in cache.iterdir():
            if stale != staging:
                shutil.rmtree(stale, ignore_errors=True)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def link_models(root: Path, *sources: Path) -> Path:
    """`root` serving every model folder of the committed artifacts and of `sources` (symbolic links)."""
    root.mkdir(parents=True, exist_ok=True)
    for source in (ARTIFACTS, *sources):
        for model in sorted(source.iterdir()):
            if (model / "config.json").is_file() and not (root / model.name).exists():
                (root / model.name).symlink_to(model.resolve(), target_is_directory=True)
    return root


def with_template(model: Path, root: Path, template: str) -> Path:
    """A copy of the chat artifact `model` in `root` whose chat template is `template` (graphs linked)."""
    folder = root / model.name
    folder.mkdir(parents=True)
    for item in model.iterdir():
        if item.suffix == ".onnx" or item.is_dir():
            (folder / item.name).symlink_to(item.resolve())
        else:
            shutil.copy(item, folder / item.name)
    (folder / TEMPLATE_FILE).write_text(template, encoding="utf-8")
    return folder
