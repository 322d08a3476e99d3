"""The engines benchmarks/anchor.py compares ours with: CTranslate2 and Hugging Face eager, same shapes.

    python -m benchmarks.anchor_engines ct2|hf|engine generator|generator-int8|translator|classifier|embedder|llama \
        --artifacts DIR --work DIR [--threads 2] [shape options]


builds nothing: it loads the models that `build_hf_and_ct2` saved in --work (or, for `engine`, our
served artifacts in --artifacts) and answers one JSON line
per JSON request line on stdin ({"row", "concurrency", "requests"} -> {"value", "lengths"}). Each engine
and model has a process of its own (see ANCHOR_MODELS): CTranslate2 and torch each bring a libgomp, and two
OpenMP runtimes in one process slowed HF's decoding 4x here; bench_anchor's HTTP client uses neither.

Each model the rows run on is one AnchorModel record in ANCHOR_MODELS: its rows, how its Hugging Face
reference is built and converted, and how each engine loads and runs it. Nothing else is keyed by model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar

import numpy as np

if TYPE_CHECKING:
    import ctranslate2

    from benchmarks.http_load import Client, Connection
    from service.runtime.artifact import Artifact

REPO = Path(__file__).resolve().parent.parent
PROMPT_SEED = 0
SOURCE = "The committee approved the new budget after a long debate about the roads."  # 20 translator tokens
TEXT = "The movie was a delight from start to finish."  # a short sentence to classify
Batch = tuple[int, list[int]]  # (units, output tokens of each request)
Run = Callable[[int], Batch]  # a batch of n requests -> (units, output tokens of each)
Greedy = Callable[[list[list[int]]], list[list[int]]]  # prompts -> each one's greedy tokens
LLAMA = "llama"  # the Llama-shaped part: built at benchmark time (build_llama), not read from --artifacts


class LlamaSize(TypedDict):
    """transformers LlamaConfig fields of one --llama-size."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int


# Grouped-query attention (4 query heads per key/value head), SwiGLU, rope. "bench" costs a decode step real
# compute on 2 cores (about 3x the generator rows' model per token); "tiny" is for the smoke tests.
LLAMA_SIZES: dict[str, LlamaSize] = {
    "bench": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "intermediate_size": 1408, "vocab_size": 8192, "max_position_embeddings": 512},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 128},
}
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2, as Llama's
CHECK_PROMPTS = 4  # prompts whose greedy tokens ours and CTranslate2 must agree on


# --- models ----------------------------------------------------------------------------------------------


def dims(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    return {**config["dims"], "vocab_size": config["vocab_size"], "max_positions": config["max_positions"],
            "special_tokens": config["special_tokens"], "labels": len(config.get("labels", [0, 0]))}


def export_random_weights(artifact: Path, out: Path) -> None:
    """Our model with the dims of `artifact` and random weights (its tokenizer), float32 and int8 graphs."""
    import torch

    from model.export.graphs import export_model
    from model.kinds import model_kind
    from model.training.checkpoint import artifact_config

    if (out / "config.json").is_file():
        return
    torch.manual_seed(0)
    model = model_kind(artifact.name).build(artifact_config(artifact))
    export_model(artifact.name, model, artifact / "tokenizer.json", out)


def link_served(artifact: Path, out: Path) -> None:
    """The served artifact itself, linked: an encoder's speed does not depend on its weights (and the
    embedder's weights come from a package)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_symlink() and out.resolve() != artifact.resolve():
        out.unlink()
    if not out.exists():
        out.symlink_to(artifact.resolve(), target_is_directory=True)


def export_random(artifacts: Path, out: Path, kinds: tuple[str, ...] | None = None) -> None:
    """Our models with the dims of `artifacts` and random weights (their tokenizers), float32 and int8 graphs,
    or linked where its record says so (each model's `export`)."""
    for kind in kinds if kinds is not None else KINDS:
        export = ANCHOR_MODELS[kind].export
        if export is not None:
            export(artifacts / kind, out / kind)


def gpt2(d: dict[str, Any]) -> Any:
    import transformers

    special = d["special_tokens"]
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=d["vocab_size"], n_positions=d["max_positions"], n_embd=d["d_model"], n_layer=d["n_layers"],
        n_head=d["n_heads"], n_inner=d["d_ff"], activation_function="gelu",
        bos_token_id=special["bos"], eos_token_id=special["eos"], pad_token_id=special["pad"]))


def marian_mt(d: dict[str, Any]) -> Any:
    """Marian's pad token is its last one (the converter drops it again: one row more than ours), and its
    zero embedding starts the decoder, as CTranslate2's start_from_zero_embedding does."""
    import transformers

    special = d["special_tokens"]
    return transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=d["vocab_size"] + 1, d_model=d["d_model"], encoder_layers=d["n_encoder_layers"],
        decoder_layers=d["n_decoder_layers"], encoder_attention_heads=d["n_heads"],
        decoder_attention_heads=d["n_heads"], encoder_ffn_dim=d["d_ff"], decoder_ffn_dim=d["d_ff"],
        max_position_embeddings=d["max_positions"], activation_function="relu", pad_token_id=d["vocab_size"],
        eos_token_id=special["eos"], bos_token_id=special["bos"], decoder_start_token_id=d["vocab_size"],
        forced_eos_token_id=None))


def bert_config(d: dict[str, Any]) -> Any:
    import transformers

    labels = range(d["labels"])  # as num_labels=labels would name them
    config = transformers.BertConfig(
        vocab_size=d["vocab_size"], hidden_size=d["d_model"], num_hidden_layers=d["n_layers"],
        num_attention_heads=d["n_heads"], intermediate_size=d["d_ff"], max_position_embeddings=d["max_positions"],
        type_vocab_size=2, id2label={i: f"LABEL_{i}" for i in labels}, label2id={f"LABEL_{i}": i for i in labels},
        pad_token_id=d["special_tokens"]["pad"])
    config.position_embedding_type = "absolute"  # transformers 5 dropped the field; CTranslate2 4.8 reads it
    return config


def bert_classifier(d: dict[str, Any]) -> Any:
    import transformers

    return transformers.BertForSequenceClassification(bert_config(d))


def bert_encoder(d: dict[str, Any]) -> Any:
    """The encoder alone (CTranslate2's converter wants its pooler too); pooled in the engines."""
    import transformers

    return transformers.BertModel(bert_config(d))


def save_head(model: Any, hf_dir: Path) -> None:
    """CTranslate2 converts BertModel: the classifier's head, kept to apply it in numpy."""
    head = model.classifier
    np.savez(hf_dir / "head.npz", weight=head.weight.detach().numpy(), bias=head.bias.detach().numpy())


@dataclass(frozen=True)
class Reference:
    """How a model's Hugging Face reference is built from our dims and converted for CTranslate2."""

    model: Callable[[dict[str, Any]], Any]  # our dims -> a random transformers model
    marian: bool = False  # the converter's vocabulary gets Marian's `<pad>` last (convert)
    save: Callable[[Any, Path], None] | None = None  # what else the engines need beside the saved model


def build_hf_and_ct2(artifacts: Path, work: Path, kinds: tuple[str, ...] | None = None) -> None:
    """work/<kind>/hf: a saved random transformers model (+ a tokenizer made from ours); work/<kind>/ct2: converted."""
    for kind in kinds if kinds is not None else KINDS:
        reference = ANCHOR_MODELS[kind].reference
        if reference is not None:
            build_reference(reference, artifacts / kind, work / kind)


def build_reference(reference: Reference, artifact: Path, out: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer

    hf_dir, ct2_dir = out / "hf", out / "ct2"
    if (ct2_dir / "model.bin").is_file():
        return
    transformers.logging.set_verbosity_error()
    d = dims(artifact)
    raw = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    names = {f"{k}_token": raw.id_to_token(v) for k, v in d["special_tokens"].items()
             if k in ("pad", "eos", "bos", "unk", "cls", "sep", "mask")}
    names.setdefault("unk_token", names.get("eos_token", names["pad_token"]))  # CTranslate2 wants one
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(artifact / "tokenizer.json"), **names)
    torch.manual_seed(0)
    model = reference.model(d)
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    if reference.save is not None:
        reference.save(model, hf_dir)
    convert(hf_dir, ct2_dir, reference.marian)


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


def exporter_digest() -> str:
    """Of the sources an export depends on: a changed exporter or graph contract gets a fresh random export."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "model").rglob("*.py"), *(REPO / "service" / "contract").rglob("*.py")]):
        digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def convert(hf_dir: Path, ct2_dir: Path, marian: bool) -> None:
    """CTranslate2's TransformersConverter on a saved transformers model. For Marian, the vocabulary gets the
    `<pad>` the converter expects last (ours, at 0, is renamed)."""
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(str(hf_dir))
    if marian:
        load = converter.load_tokenizer
        converter.load_tokenizer = lambda *args, **kwargs: marian_vocabulary(load(*args, **kwargs))
    converter.convert(str(ct2_dir), force=True)


def marian_vocabulary(tokenizer: Any) -> _Vocabulary:
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    tokens = [("<ours:pad>" if t == "<pad>" else t) for t in tokens] + ["<pad>"]
    return _Vocabulary(tokenizer, {t: i for i, t in enumerate(tokens)})


class _Vocabulary:
    def __init__(self, tokenizer: Any, vocab: dict[str, int]) -> None:
        self._tokenizer, self._vocab = tokenizer, vocab

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


# --- shapes ------------------------------------------------------------------------------------------------


def _encode(folder: Path, text: str) -> list[int]:
    """`text` as the model in `folder` tokenizes it; [] where that model is not among the rows' (not run)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    return Tokenizer.from_file(str(path)).encode(text).ids if path.is_file() else []


class Shapes:
    def __init__(self, args: argparse.Namespace, artifacts: Path) -> None:
        self.new_tokens: int = args.new_tokens
        self.target_tokens: int = args.target_tokens
        self.prompt: list[int] = []  # a random prompt, where the generator is among the rows' models
        if (artifacts / "generator" / "config.json").is_file():
            vocab = dims(artifacts / "generator")["vocab_size"]
            self.prompt = [int(i) for i in np.random.default_rng(PROMPT_SEED).integers(10, vocab, args.prompt_tokens)]
        self.source = _encode(artifacts / "translator", SOURCE)
        self.text = _encode(artifacts / "classifier", TEXT)
        self.embed_text = _encode(artifacts / "embedder", TEXT)  # the classifier's sentence, the embedder's tokens
        self.llama_size: str = args.llama_size
        rng = np.random.default_rng(PROMPT_SEED + 1)
        vocab = LLAMA_SIZES[self.llama_size]["vocab_size"]
        self.llama_prompt = [int(i) for i in rng.integers(len(LLAMA_SPECIALS), vocab, args.prompt_tokens)]
        # Prompts of other lengths for the agreement check of ours and CTranslate2.
        self.check_prompts = [[int(i) for i in rng.integers(len(LLAMA_SPECIALS), vocab, n)]
                              for n in np.linspace(2, max(2, args.prompt_tokens), CHECK_PROMPTS).astype(int)]


@dataclass(frozen=True)
class Setup:
    """What an engine process loads its model from."""

    artifacts: Path  # our served artifacts (tokenizers, dims)
    work: Path  # where build_hf_and_ct2 and build_llama saved the models
    shapes: Shapes
    threads: int


# --- engines: each loads one model and runs n requests as one batch ----------------------------------------


class Generating(Protocol):
    def generate(self, n: int) -> Batch: ...


class Decoding(Generating, Protocol):
    """A generator whose greedy tokens can be compared with another engine's."""

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]: ...


class Translating(Protocol):
    def translate(self, beams: int) -> Run: ...


class Encoding(Protocol):
    """A classifier or an embedder: one sequence a request."""

    def encode(self, n: int) -> Batch: ...


class _CT2:
    """CTranslate2 on one converted model; token strings come from its vocabulary.json."""

    def __init__(self, path: Path, setup: Setup, compute_type: str) -> None:
        self.s = setup.shapes
        self.vocab: list[str] = json.loads(next(f for f in (path / "vocabulary.json", path / "shared_vocabulary.json")
                                                if f.is_file()).read_text())
        self.opts: dict[str, Any] = {"device": "cpu", "intra_threads": setup.threads, "inter_threads": 1,
                                     "compute_type": compute_type}


class CT2Generator(_CT2):
    def __init__(self, path: Path, setup: Setup, prompt: list[int], compute_type: str = "float32") -> None:
        import ctranslate2

        super().__init__(path, setup, compute_type)
        self.prompt = [self.vocab[i] for i in prompt]
        self.generator = ctranslate2.Generator(str(path), **self.opts)

    def generate(self, n: int) -> Batch:
        out = self.generator.generate_batch(
            [self.prompt] * n, max_length=self.s.new_tokens, min_length=self.s.new_tokens,
            include_prompt_in_result=False, beam_size=1)
        lengths = [len(r.sequences_ids[0]) for r in out]
        return sum(lengths), lengths

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy tokens of each prompt up to the end token (not included), at most new_tokens."""
        out = self.generator.generate_batch([[self.vocab[i] for i in p] for p in prompts],
                                            max_length=self.s.new_tokens, include_prompt_in_result=False, beam_size=1)
        return [list(r.sequences_ids[0]) for r in out]


class CT2Translator(_CT2):
    def __init__(self, path: Path, setup: Setup) -> None:
        import ctranslate2

        super().__init__(path, setup, "float32")
        self.source = [self.vocab[i] for i in self.s.source]
        self.translator = ctranslate2.Translator(str(path), **self.opts)

    def translate(self, beams: int) -> Run:
        def run(n: int) -> Batch:
            out = self.translator.translate_batch(
                [self.source] * n, beam_size=beams, max_decoding_length=self.s.target_tokens,
                min_decoding_length=self.s.target_tokens, no_repeat_ngram_size=0, length_penalty=1.0)
            lengths = [len(r.hypotheses[0]) for r in out]
            return sum(lengths), lengths
        return run


class _CT2Encoder(_CT2):
    def __init__(self, path: Path, setup: Setup, ids: list[int]) -> None:
        import ctranslate2

        super().__init__(path, setup, "float32")
        self.ids = ids
        self.encoder = ctranslate2.Encoder(str(path), **self.opts)

    def forward(self, n: int) -> ctranslate2.EncoderForwardOutput:
        return self.encoder.forward_batch([self.ids] * n, token_type_ids=[[0] * len(self.ids)] * n)


class CT2Classifier(_CT2Encoder):
    """BertModel's pooled output in CTranslate2, then the classifier's head (head.npz) in numpy."""

    def __init__(self, path: Path, setup: Setup, head: Path) -> None:
        super().__init__(path, setup, setup.shapes.text)
        weights = np.load(head)
        self.head_w, self.head_b = weights["weight"].T.copy(), weights["bias"]

    def encode(self, n: int) -> Batch:
        logits = np.asarray(self.forward(n).pooler_output) @ self.head_w + self.head_b
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return n, [0] * n


class CT2Embedder(_CT2Encoder):
    """BertModel's last hidden state in CTranslate2, mean-pooled and normalised in numpy."""

    def __init__(self, path: Path, setup: Setup) -> None:
        super().__init__(path, setup, setup.shapes.embed_text)

    def encode(self, n: int) -> Batch:
        mean_pool(np.asarray(self.forward(n).last_hidden_state), np.ones((n, len(self.ids)), np.float32))
        return n, [0] * n


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, S, D] hidden states, [B, S] mask -> [B, D] unit vectors: the embedder's mean pooling and normalize."""
    pooled: np.ndarray = (hidden * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    unit: np.ndarray = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return unit


class _HF:
    """Eager PyTorch on one saved reference (work/<artifact>/hf), of the class it was saved as."""

    def __init__(self, setup: Setup, artifact: str) -> None:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        torch.set_num_threads(setup.threads)
        self.torch, self.s = torch, setup.shapes
        folder = setup.work / artifact / "hf"
        (architecture,) = json.loads((folder / "config.json").read_text())["architectures"]
        model_class: Any = getattr(transformers, architecture)  # one of the Reference models'
        self.model = model_class.from_pretrained(folder).eval()


class HFGenerator(_HF):
    """transformers' generate, greedy."""

    def __init__(self, setup: Setup, artifact: str, prompt: list[int]) -> None:
        super().__init__(setup, artifact)
        self.prompt = prompt

    def generate(self, n: int) -> Batch:
        ids = self.torch.tensor([self.prompt] * n)
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=self.s.new_tokens, min_new_tokens=self.s.new_tokens)
        lengths = [out.shape[1] - ids.shape[1]] * n
        return sum(lengths), lengths


class HFTranslator(_HF):
    """transformers' generate, greedy or beam search."""

    def translate(self, beams: int) -> Run:
        def run(n: int) -> Batch:
            ids = self.torch.tensor([self.s.source] * n)
            with self.torch.inference_mode():
                out = self.model.generate(
                    ids, attention_mask=self.torch.ones_like(ids), num_beams=beams, do_sample=False,
                    max_new_tokens=self.s.target_tokens, min_new_tokens=self.s.target_tokens,
                    no_repeat_ngram_size=0, length_penalty=1.0, early_stopping=False)
            lengths = [out.shape[1] - 1] * n  # after the decoder start token
            return sum(lengths), lengths
        return run


class HFClassifier(_HF):
    def encode(self, n: int) -> Batch:
        ids = self.torch.tensor([self.s.text] * n)
        with self.torch.inference_mode():
            self.model(input_ids=ids, attention_mask=self.torch.ones_like(ids),
                       token_type_ids=self.torch.zeros_like(ids)).logits.softmax(-1)
        return n, [0] * n


class HFEmbedder(_HF):
    """BertModel, then mean pooling and normalisation in torch."""

    def encode(self, n: int) -> Batch:
        ids = self.torch.tensor([self.s.embed_text] * n)
        mask = self.torch.ones_like(ids)
        with self.torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask, token_type_ids=self.torch.zeros_like(ids))
            real = mask.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
            pooled = (hidden.last_hidden_state * real).sum(1) / real.sum(1).clamp(min=1e-9)
            self.torch.nn.functional.normalize(pooled, dim=-1)
        return n, [0] * n


@dataclass
class Served:
    """One of our artifacts loaded as the server's worker loads it: the graphs' sessions, its tokenizer."""

    kind: str
    artifact: Artifact
    sessions: dict[str, Any]
    tokenizer: Any
    metrics: Any

    @classmethod
    def load(cls, folder: Path, threads: int, int8: bool = False) -> Served:
        from service.engine.metrics import Metrics
        from service.runtime.artifact import load_artifact
        from service.runtime.sessions import RuntimeOptions, artifact_sessions

        artifact = load_artifact(folder)
        options = RuntimeOptions(device="cpu", intra_op_threads=threads, quantization="int8" if int8 else "none")
        initializers = artifact.weights_package.load() if artifact.weights_package else None
        sessions = artifact_sessions(folder.name, artifact.graphs, options, initializers)
        return cls(folder.name, artifact, dict(sessions), artifact.load_tokenizer(), Metrics())


class _Ours:
    """Our engine in process, without HTTP or the scheduler's thread: the model classes the server's worker
    drives (prefill, then steps until every sequence is done), on the served graphs, a batch per call as the
    others get. Beside the HTTP row it shows what is engine and what is the server around it."""

    def __init__(self, setup: Setup, model: Any) -> None:
        self.s, self.model = setup.shapes, model

    def _run(self, sequences: list[Any]) -> list[Any]:
        """Every sequence's final event, in order."""
        emits, batch = self.model.prefill(sequences)
        while batch is not None and batch.rows:
            emits += batch.step()
        final = {id(e.sequence): e.event for e in emits if e.final}
        return [final[id(seq)] for seq in sequences]


class OursGenerator(_Ours):
    def __init__(self, setup: Setup, served: Served, prompt: list[int]) -> None:
        from service.engine.cache.in_place import InPlaceDecoder
        from service.engine.tasks.generation.decoding import GenerationModel
        from service.settings import Settings

        session, artifact = served.sessions["decoder"], served.artifact
        settings = Settings(max_input_tokens=artifact.max_positions, max_new_tokens=artifact.max_positions)
        in_place = InPlaceDecoder.for_session(served.kind, session, artifact, settings, served.metrics)
        super().__init__(setup, GenerationModel(served.kind, artifact, session, served.tokenizer, served.metrics,
                                                in_place))
        self.prompt = prompt

    def generate(self, n: int) -> Batch:
        from service.engine.tasks.generation.decoding import GenerationParams, GenerationSequence
        from service.engine.tokens.sampling import SamplingParams

        params = GenerationParams(self.s.new_tokens, SamplingParams(temperature=0.0), ignore_eos=True)
        lengths = [r.completion_tokens for r in self._run([GenerationSequence(self.prompt, params) for _ in range(n)])]
        return sum(lengths), lengths

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy tokens of each prompt up to the end token (not included), at most new_tokens."""
        from service.engine.tasks.generation.decoding import GenerationParams, GenerationSequence
        from service.engine.tokens.sampling import SamplingParams

        params = GenerationParams(self.s.new_tokens, SamplingParams(temperature=0.0))
        return [[t.id for t in r.tokens] for r in self._run([GenerationSequence(p, params) for p in prompts])]


class OursTranslator(_Ours):
    def __init__(self, setup: Setup, served: Served) -> None:
        from service.engine.tasks.translation.decoding import TranslationModel

        super().__init__(setup, TranslationModel(served.kind, served.artifact, served.sessions["encoder"],
                                                 served.sessions["decoder"], served.tokenizer, served.metrics))

    def translate(self, beams: int) -> Run:
        from service.engine.tasks.translation.decoding import TranslationParams, TranslationSequence

        params = TranslationParams(num_beams=beams, max_new_tokens=self.s.target_tokens, no_repeat_ngram_size=0)

        def run(n: int) -> Batch:
            sequences = [TranslationSequence(self.s.source, params, self.s.target_tokens) for _ in range(n)]
            lengths = [len(r.hypotheses[0].token_ids) for r in self._run(sequences)]
            return sum(lengths), lengths
        return run


class OursClassifier(_Ours):
    def __init__(self, setup: Setup, served: Served) -> None:
        from service.engine.tasks.classification.service import ClassificationModel

        super().__init__(setup, ClassificationModel(served.artifact, served.sessions["encoder"], served.tokenizer))

    def encode(self, n: int) -> Batch:
        from service.engine.tasks.classification.service import ClassificationSequence, ClassifyItem

        item = ClassifyItem(self.s.text, [0] * len(self.s.text), False)
        self._run([ClassificationSequence(item, None) for _ in range(n)])
        return n, [0] * n


class OursEmbedder(_Ours):
    def __init__(self, setup: Setup, served: Served) -> None:
        from service.engine.tasks.embedding.service import EmbeddingModel

        super().__init__(setup, EmbeddingModel(served.artifact, served.sessions["encoder"]))

    def encode(self, n: int) -> Batch:
        from service.engine.tasks.embedding.service import EmbeddingSequence

        self._run([EmbeddingSequence(self.s.embed_text, True, None) for _ in range(n)])
        return n, [0] * n


# --- the models: one record each -----------------------------------------------------------------------------


class Clients(Protocol):
    """Our server's HTTP client of each workload (benchmarks/anchor.py's Ours); lengths forced."""

    def generate(self, stream: bool, model: str, prompt: list[int]) -> Client: ...

    def translate(self, beams: int) -> Client: ...

    def classify(self, conn: Connection) -> Awaitable[tuple[int, float | None]]: ...

    def embed(self, conn: Connection) -> Awaitable[tuple[int, float | None]]: ...


R = TypeVar("R")  # what an engine loads a model as: Generating, Decoding, Translating or Encoding


@dataclass(frozen=True)
class Row(Generic[R]):
    """One row of the table: its workload, and how each engine (ours over HTTP too) runs a request of it."""

    workload: str
    unit: str
    concurrency: int
    requests: int  # at --scale 1
    run: Callable[[R], Run]  # a loaded engine's batch function
    http: Callable[[Clients, Shapes], Client]  # our server's request


@dataclass(frozen=True)
class TokenCheck(Generic[R]):
    """Greedy tokens of ours in process and CTranslate2 on the same prompts (Shapes.check_prompts)."""

    label: str  # the model, in the line the run prints
    greedy: Callable[[R], Greedy]
    facts: Callable[[str, dict[str, Any]], dict[str, Any]]  # (--llama-size, the check) -> its JSON entry


@dataclass(frozen=True)
class AnchorModel(Generic[R]):
    """One model the rows run on. Each (engine, model) pair gets a process of its own: with CTranslate2 4.8.5
    here (AMD EPYC), loading an int8 model beside a float32 one halved the float32 generator's speed, and
    after a translator batch in the same process it decoded one request 4x slower."""

    name: str  # the engine processes' `part`
    artifact: str  # what our server serves it as; its folder in --artifacts and in --work
    rows: dict[str, Row[R]]
    ct2: Callable[[Setup], R]
    ours: Callable[[Setup], R]  # our engine in process
    hf: Callable[[Setup], R] | None = None  # None: no HF eager row
    reference: Reference | None = None  # its HF and CTranslate2 models in work/<artifact>; None: another's
    export: Callable[[Path, Path], None] | None = None  # (--artifacts/<artifact>, served/<artifact>) with --ours random
    build: Callable[[Path, str], Path] | None = None  # (work, llama size) -> what ours serves; None: --artifacts
    check: TokenCheck[R] | None = None  # its greedy tokens, checked against CTranslate2's before measuring
    server: str = "float32"  # which of our servers its rows go to: "float32", "int8" or its own (its name)
    int8_graphs: bool = True  # False: its graphs are float32 only (the int8 server does not serve it)
    floor_dimensions: Callable[[Path], int] | None = None  # the size of the floor's answers, from its folder

    def loader(self, engine: str) -> Callable[[Setup], R] | None:
        return {"ct2": self.ct2, "hf": self.hf, "engine": self.ours}[engine]


def _served(setup: Setup, kind: str, int8: bool = False) -> Served:
    return Served.load(setup.artifacts / kind, setup.threads, int8)


def _generate(engine: Generating) -> Run:
    return engine.generate


def _encoding(engine: Encoding) -> Run:
    return engine.encode


def encoder_rows(name: str, http: Callable[[Clients, Shapes], Client]) -> dict[str, Row[Encoding]]:
    """An encoder's two rows: 32 concurrent single texts, and one text at a time."""
    return {f"{name}_c32": Row(f"{name}, 32 concurrent single texts", "seq/s", 32, 128, _encoding, http),
            f"{name}_c1": Row(f"{name}, one text at a time", "seq/s", 1, 128, _encoding, http)}


ANCHOR_MODELS: dict[str, AnchorModel[Any]] = {model.name: model for model in (
    AnchorModel[Generating](
        "generator", "generator",
        rows={
            "generator_c16": Row("generator, 16 concurrent requests", "tok/s", 16, 48, _generate,
                                 lambda http, s: http.generate(False, "generator", s.prompt)),
            "generator_c16_stream": Row("generator, 16 concurrent, streamed", "tok/s", 16, 48, _generate,
                                        lambda http, s: http.generate(True, "generator", s.prompt)),
            "generator_c1": Row("generator, one request at a time", "tok/s", 1, 6, _generate,
                                lambda http, s: http.generate(False, "generator", s.prompt)),
        },
        ct2=lambda setup: CT2Generator(setup.work / "generator" / "ct2", setup, setup.shapes.prompt),
        ours=lambda setup: OursGenerator(setup, _served(setup, "generator"), setup.shapes.prompt),
        hf=lambda setup: HFGenerator(setup, "generator", setup.shapes.prompt),
        reference=Reference(gpt2), export=export_random_weights,
    ),
    AnchorModel[Translating](
        "translator", "translator",
        rows={
            "translator_beam4_c16": Row("translator, 16 concurrent, beam 4", "tok/s", 16, 32,
                                        lambda engine: engine.translate(4), lambda http, s: http.translate(4)),
            "translator_greedy_c16": Row("translator, 16 concurrent, greedy", "tok/s", 16, 48,
                                         lambda engine: engine.translate(1), lambda http, s: http.translate(1)),
        },
        ct2=lambda setup: CT2Translator(setup.work / "translator" / "ct2", setup),
        ours=lambda setup: OursTranslator(setup, _served(setup, "translator")),
        hf=lambda setup: HFTranslator(setup, "translator"),
        reference=Reference(marian_mt, marian=True), export=export_random_weights,
    ),
    AnchorModel[Encoding](
        "classifier", "classifier",
        rows=encoder_rows("classifier", lambda http, s: http.classify),
        ct2=lambda setup: CT2Classifier(setup.work / "classifier" / "ct2", setup,
                                        setup.work / "classifier" / "hf" / "head.npz"),
        ours=lambda setup: OursClassifier(setup, _served(setup, "classifier")),
        hf=lambda setup: HFClassifier(setup, "classifier"),
        reference=Reference(bert_classifier, save=save_head), export=export_random_weights,
    ),
    AnchorModel[Generating](  # the generator's artifact and references, int8 (no HF eager row)
        "generator-int8", "generator",
        rows={"generator_int8_c16": Row("int8 generator, 16 concurrent (vs CT2 int8)", "tok/s", 16, 48, _generate,
                                        lambda http, s: http.generate(False, "generator", s.prompt))},
        ct2=lambda setup: CT2Generator(setup.work / "generator" / "ct2", setup, setup.shapes.prompt, "int8"),
        ours=lambda setup: OursGenerator(setup, _served(setup, "generator", int8=True), setup.shapes.prompt),
        server="int8",
    ),
    AnchorModel[Encoding](  # served as it is (its weights come from a package)
        "embedder", "embedder",
        rows=encoder_rows("embedder", lambda http, s: http.embed),
        ct2=lambda setup: CT2Embedder(setup.work / "embedder" / "ct2", setup),
        ours=lambda setup: OursEmbedder(setup, _served(setup, "embedder")),
        hf=lambda setup: HFEmbedder(setup, "embedder"),
        reference=Reference(bert_encoder), export=link_served, int8_graphs=False,
        floor_dimensions=lambda folder: int(dims(folder)["d_model"]),
    ),
    AnchorModel[Decoding](  # built here with random weights (--llama-size); no HF eager row
        LLAMA, LLAMA,
        rows={
            "llama_c16": Row("Llama-shaped (grouped-query) generator, 16 concurrent", "tok/s", 16, 48, _generate,
                             lambda http, s: http.generate(False, LLAMA, s.llama_prompt)),
            "llama_c1": Row("Llama-shaped generator, one request at a time", "tok/s", 1, 6, _generate,
                            lambda http, s: http.generate(False, LLAMA, s.llama_prompt)),
        },
        ct2=lambda setup: CT2Generator(llama_folder(setup.work, setup.shapes.llama_size) / "ct2", setup,
                                       setup.shapes.llama_prompt),
        ours=lambda setup: OursGenerator(
            setup, Served.load(llama_served(setup.work, setup.shapes.llama_size) / LLAMA, setup.threads),
            setup.shapes.llama_prompt),
        build=prepare_llama, check=TokenCheck("Llama-shaped", lambda engine: engine.greedy, llama_facts),
        server=LLAMA,
    ),
)}
# Our artifacts the rows read from --artifacts, in the table's order (each also names its float32 model).
KINDS = tuple(dict.fromkeys(m.artifact for m in ANCHOR_MODELS.values() if m.build is None))
ROWS: dict[str, Row[Any]] = {row: spec for m in ANCHOR_MODELS.values() for row, spec in m.rows.items()}
PARTS = {row: m.name for m in ANCHOR_MODELS.values() for row in m.rows}  # the model each row runs on


def batched(run: Run, concurrency: int, requests: int) -> tuple[float, list[int]]:
    """Units per second over ceil(requests / concurrency) batches, after one untimed batch."""
    run(concurrency)
    lengths: list[int] = []
    units, started = 0, time.perf_counter()
    for _ in range(-(-requests // concurrency)):
        u, lens = run(concurrency)
        units, lengths = units + u, lengths + lens
    return units / (time.perf_counter() - started), lengths


def shape_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--target-tokens", type=int, default=30)
    parser.add_argument("--llama-size", choices=sorted(LLAMA_SIZES), default="bench",
                        help="dims of the Llama-shaped rows' model (built with random weights)")


@dataclass
class Loaded:
    """One model on one engine: the batch function of each of its rows, and its greedy check if it has one."""

    runs: dict[str, Run]
    greedy: Greedy | None = None


def load(engine: str, part: str, setup: Setup) -> Loaded:
    model = ANCHOR_MODELS[part]
    loader = model.loader(engine)
    if loader is None:
        raise SystemExit(f"no {engine} engine for {part}")
    loaded = loader(setup)
    return Loaded({row: spec.run(loaded) for row, spec in model.rows.items()},
                  model.check.greedy(loaded) if model.check is not None else None)


def main() -> None:
    """Load one engine, then answer requests (the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("ct2", "hf", "engine"))
    parser.add_argument("part", choices=sorted(ANCHOR_MODELS))
    parser.add_argument("--artifacts", type=Path, required=True, help="our artifacts (tokenizers, dims)")
    parser.add_argument("--work", type=Path, required=True, help="where build_hf_and_ct2 saved the models")
    shape_options(parser)
    args = parser.parse_args()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    setup = Setup(args.artifacts, args.work, Shapes(args, args.artifacts), args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load(args.engine, args.part, setup)
    try:
        protocol.write(json.dumps({"ready": True}) + "\n")
        for line in sys.stdin:
            ask = json.loads(line)
            if "greedy" in ask:  # the agreement check: {"greedy": prompts} -> {"tokens": each one's tokens}
                if loaded.greedy is None:
                    raise SystemExit(f"{args.part} has no greedy check")
                protocol.write(json.dumps({"tokens": loaded.greedy(ask["greedy"])}) + "\n")
                continue
            value, lengths = batched(loaded.runs[ask["row"]], ask["concurrency"], ask["requests"])
            protocol.write(json.dumps({"value": value, "lengths": lengths}) + "\n")
    except BrokenPipeError:  # bench_anchor stopped (e.g. a server failed to start): its error is the one to read
        pass


if __name__ == "__main__":
    main()
