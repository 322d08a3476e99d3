"""The Llama-shaped model of the anchor's Llama rows (--llama-size): a random LlamaForCausalLM (grouped-query
attention, SwiGLU, rope) built here, converted for CTranslate2 and imported by our importer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.anchor_references import convert, exporter_digest
from benchmarks.anchor_shapes import LLAMA, LLAMA_SIZES, LLAMA_SPECIALS


def llama_folder(work: Path, size: str) -> Path:
    """work/llama-SIZE: hf/ (the checkpoint), ct2/ (converted) and ours-<exporter digest>/llama (our import)."""
    return work / f"llama-{size}"


def llama_served(work: Path, size: str) -> Path:
    """The folder our server serves for the Llama rows (it holds the artifact `llama`)."""
    return llama_folder(work, size) / f"ours-{exporter_digest()}"


def kv_bytes_per_token(size: str) -> int:
    """float32 key and value of the key/value heads only, every layer (docs/decoders.md)."""
    c = LLAMA_SIZES[size]
    d_head = c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * d_head * 4


def word_level_tokenizer(folder: Path, vocab_size: int) -> Any:
    """A tokenizer with one token per id of the model (prompts are ids; every generated id decodes)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(LLAMA_SPECIALS)}
    vocab |= {f"w{i}": i for i in range(len(vocab), vocab_size)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>",
                                                     eos_token="</s>")
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def save_llama(folder: Path, size: str) -> None:
    """A random LlamaForCausalLM with its tokenizer. Weights are rounded to float16 values first: the importer
    stores float16, so ours and CTranslate2 (float32) then run exactly the same weights."""
    import torch
    import transformers

    word_level_tokenizer(folder, LLAMA_SIZES[size]["vocab_size"])
    config = transformers.LlamaConfig(**LLAMA_SIZES[size], bos_token_id=1, eos_token_id=2, pad_token_id=None,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.copy_(tensor.half().float())
    model.save_pretrained(str(folder))


def build_llama(work: Path, size: str) -> Path:
    """The Llama-shaped checkpoint, its CTranslate2 conversion and our import of it (cached in `work`);
    returns the folder our server serves (it holds the artifact `llama`)."""
    from model.importing.hf_artifact import import_to_artifact

    folder = llama_folder(work, size)
    hf_dir, ct2_dir, served = folder / "hf", folder / "ct2", llama_served(work, size)
    if not (hf_dir / "config.json").is_file():
        hf_dir.mkdir(parents=True, exist_ok=True)
        save_llama(hf_dir, size)
    if not (ct2_dir / "model.bin").is_file():
        convert(hf_dir, ct2_dir, marian=False)
    if not (served / LLAMA / "config.json").is_file():
        import_to_artifact(hf_dir, served / LLAMA, LLAMA, license_="random weights", int8=False,
                           command=f"python -m scripts.import_checkpoint {hf_dir} --out {served / LLAMA} --no-int8")
    return served


def prepare_llama(work: Path, size: str) -> Path:
    """build_llama, and a line about the model."""
    served = build_llama(work, size)
    print(f"Llama-shaped model ({size}): {LLAMA_SIZES[size]}, KV cache {kv_bytes_per_token(size):,} bytes "
          "per token (key/value heads only, float32)", flush=True)
    return served


def llama_facts(size: str, agreement: dict[str, Any]) -> dict[str, Any]:
    """The Llama-shaped model's dims, its KV cache per token (key/value heads only) and the token check."""
    c = LLAMA_SIZES[size]
    full = kv_bytes_per_token(size) * c["num_attention_heads"] // c["num_key_value_heads"]
    return {"size": size, "config": c, "d_head": c["hidden_size"] // c["num_attention_heads"],
            "kv_cache_bytes_per_token": kv_bytes_per_token(size), "kv_bytes_per_token_every_head": full,
            "greedy_tokens": agreement}
