"""The models benchmarks/peers.py runs: random weights in the shapes of real checkpoints, built at benchmark time
with `transformers` (nothing is downloaded) and saved under --work with what each engine loads:

    WORK/NAME/hf/      the checkpoint (config.json, model.safetensors, a tokenizer with one token per id)
    WORK/NAME/ours/NAME  our import (python -m scripts.import_checkpoint)
    WORK/NAME/ct2/     CTranslate2's conversion (ct2-transformers-converter)
    WORK/NAME/genai-fp32/, genai-int4/  onnxruntime-genai's model builder (decoders; needs .venv-peers)

Each step is skipped when its output is already there. The tokenizer maps `w<id>` to id, so a prompt of random
ids is the same tokens for every engine, and every generated id decodes to one word.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PEERS_PYTHON = Path(os.environ.get("PEERS_VENV", REPO / ".venv-peers")) / "bin" / "python"  # `make peers`
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 of a decoder's tokenizer
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class Shape:
    """One model: its transformers class and config, and what it is (decoder, encoder or seq2seq)."""

    name: str
    role: str  # "decoder", "encoder" or "seq2seq"
    config_class: str
    model_class: str
    config: dict[str, Any] = field(default_factory=dict)
    specials: tuple[str, ...] = SPECIALS  # a decoder's ids 0, 1, 2: unknown, start, end

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_positions(self) -> int:
        return int(self.config["max_position_embeddings"])


ROPE = {"rope_type": "default"}
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("smollm2-135m", "decoder", "LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "rope_parameters": ROPE | {"rope_theta": 100000.0}}),
    Shape("qwen2.5-0.5b", "decoder", "Qwen2Config", "Qwen2ForCausalLM", {
        "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "rope_parameters": ROPE | {"rope_theta": 1000000.0}},
        # Qwen2's tokenizer class adds <|endoftext|> when the vocabulary lacks it
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>")),
    Shape("tiny-llama", "decoder", "LlamaConfig", "LlamaForCausalLM", {  # for the smoke test
        "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "rope_parameters": ROPE | {"rope_theta": 10000.0}}),
    Shape("bert-base", "encoder", "BertConfig", "BertModel", {
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
        "vocab_size": 30522, "max_position_embeddings": 512}),
    Shape("minilm-l12", "encoder", "BertConfig", "BertModel", {
        "hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 1536,
        "vocab_size": 30522, "max_position_embeddings": 512}),
    Shape("tiny-bert", "encoder", "BertConfig", "BertModel", {  # for the smoke test
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 512, "max_position_embeddings": 128}),
)}


def folder(work: Path, shape: Shape) -> Path:
    return work / shape.name


def served(work: Path, shape: Shape) -> Path:
    """The folder our server serves (it holds the artifact named after the model)."""
    return folder(work, shape) / "ours"


def word_tokenizer(out: Path, shape: Shape) -> None:
    """A tokenizer with one token per id: `w<id>`, specials first (WordPiece for BERT, word-level else)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    if shape.role == "encoder":  # BERT: WordPiece over the same words
        words = [*BERT_SPECIALS, *(f"w{i}" for i in range(len(BERT_SPECIALS), shape.vocab_size))]
        (out / "vocab.txt").write_text("\n".join(words) + "\n")
        transformers.BertTokenizer(str(out / "vocab.txt"), do_lower_case=False).save_pretrained(str(out))
        return
    unknown, start, end = shape.specials
    vocab = {t: i for i, t in enumerate(shape.specials)} | {f"w{i}": i for i in range(3, shape.vocab_size)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token=unknown, bos_token=start,
                                                     eos_token=end)
    tokenizer.save_pretrained(str(out))


def save_checkpoint(out: Path, shape: Shape) -> None:
    """Random weights, rounded to float16 values (our importer stores float16: every engine runs the same
    weights), saved with the tokenizer."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    word_tokenizer(out, shape)
    # transformers 5 dropped BERT's position_embedding_type; CTranslate2 4.8 reads it
    extra: dict[str, Any] = ({"bos_token_id": 1, "eos_token_id": 2} if shape.role == "decoder"
                             else {"position_embedding_type": "absolute"})
    config = getattr(transformers, shape.config_class)(**shape.config, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, shape.model_class)(config)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.copy_(tensor.half().float())
    model.save_pretrained(str(out))


def _step(what: str, done: Path, command: list[str]) -> None:
    if done.exists():
        return
    started = time.perf_counter()
    print(f"building {what}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True, cwd=REPO)
    print(f"built {what} in {time.perf_counter() - started:.0f} s", flush=True)


def ct2_converter() -> list[str]:
    """CTranslate2's converter: the console script beside this interpreter, else its entry point (pip --target,
    as benchmarks/gpu_check.py installs it, puts the script elsewhere); [] without ctranslate2."""
    script = Path(sys.executable).parent / "ct2-transformers-converter"
    if script.is_file():
        return [str(script)]
    if importlib.util.find_spec("ctranslate2") is None:
        return []
    entry = "import sys; from ctranslate2.converters.transformers import main; sys.argv[0] = 'ct2'; main()"
    return [sys.executable, "-c", entry]


def build(work: Path, shape: Shape, threads: int, genai: bool, ct2: bool = True) -> None:
    """The checkpoint, our import, CTranslate2's conversion (`ct2`) and (`genai`) onnxruntime-genai's fp32 and
    int4 graphs of one model, each step skipped when done."""
    root = folder(work, shape)
    hf = root / "hf"
    if not (hf / "model.safetensors").is_file():
        started = time.perf_counter()
        save_checkpoint(hf, shape)
        print(f"built the {shape.name} checkpoint in {time.perf_counter() - started:.0f} s", flush=True)
    ours = served(work, shape) / shape.name
    _step(f"{shape.name} (ours)", ours / "config.json",
          [sys.executable, "-m", "scripts.import_checkpoint", str(hf), "--out", str(ours), "--no-int8",
           "--threads", str(threads), "--license", "random weights"])
    converter = ct2_converter() if ct2 else []
    if converter:
        _step(f"{shape.name} (CTranslate2)", root / "ct2" / "model.bin",
              [*converter, "--model", str(hf), "--output_dir", str(root / "ct2"), "--force"])
    if genai and shape.role == "decoder" and has_genai():
        for precision in ("fp32", "int4"):
            out = root / f"genai-{precision}"
            _step(f"{shape.name} (onnxruntime-genai {precision})", out / "genai_config.json",
                  [str(PEERS_PYTHON), "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
                   "-p", precision, "-e", "cpu", "-c", str(root / "genai-cache")])
            set_genai_threads(out, threads)


def set_genai_threads(out: Path, threads: int) -> None:
    """onnxruntime-genai reads its session options from genai_config.json."""
    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options |= {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    path.write_text(json.dumps(config, indent=2))


def peers_has(module: str) -> bool:
    """Whether .venv-peers (`make peers`) has `module`."""
    if not PEERS_PYTHON.is_file():
        return False
    check = f"import importlib.util as u; exit(u.find_spec('{module}') is None)"
    found = subprocess.run([str(PEERS_PYTHON), "-c", check], capture_output=True)
    return found.returncode == 0


def has_genai() -> bool:
    return peers_has("onnxruntime_genai")


if __name__ == "__main__":  # python -m benchmarks.peers_models NAME... [--work DIR]: build without measuring
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--work", type=Path, default=REPO / ".peers-cache")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2's conversion")
    parser.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai's model builder")
    args = parser.parse_args()
    for name in args.models:
        build(args.work, SHAPES[name], args.threads, genai=not args.no_genai, ct2=not args.no_ct2)
