"""The engines benchmarks/anchor.py compares ours with: CTranslate2 and Hugging Face eager, same shapes.

    python -m benchmarks.anchor_engines ct2|hf|engine generator|generator-int8|translator|classifier|embedder|llama \
        --artifacts DIR --work DIR [--threads 2] [shape options]


builds nothing: it loads the models that `build_hf_and_ct2` saved in --work (or, for `engine`, our
served artifacts in --artifacts) and answers one JSON line
per JSON request line on stdin ({"row", "concurrency", "requests"} -> {"value", "lengths"}). Each engine
and model has a process of its own (see PARTS): CTranslate2 and torch each bring a libgomp, and two
OpenMP runtimes in one process slowed HF's decoding 4x here; bench_anchor's HTTP client uses neither.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PROMPT_SEED = 0
SOURCE = "The committee approved the new budget after a long debate about the roads."  # 20 translator tokens
TEXT = "The movie was a delight from start to finish."  # a short sentence to classify
KINDS = ("generator", "translator", "classifier", "embedder")
EMBEDDER = "embedder"  # served as it is (its weights come from a package): export_random links it
Run = Callable[[int], tuple[int, list[int]]]  # a batch of n requests -> (units, output tokens of each)
LLAMA = "llama"  # the Llama-shaped part: built at benchmark time (build_llama), not read from --artifacts
# transformers LlamaConfig fields of each --llama-size: grouped-query attention (4 query heads per key/value
# head), SwiGLU, rope. "bench" costs a decode step real compute on 2 cores (about 3x the generator rows'
# model per token); "tiny" is for the smoke tests.
LLAMA_SIZES: dict[str, dict[str, int]] = {
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


def export_random(artifacts: Path, out: Path, kinds: tuple[str, ...] = KINDS) -> None:
    """Our models with the dims of `artifacts` and random weights (their tokenizers), float32 and int8 graphs;
    the embedder is the served one, linked (an encoder's speed does not depend on its weights)."""
    import torch

    from model.checkpoint import artifact_config
    from model.export import MODEL_CLASSES, export_model

    for kind in kinds:
        if kind == EMBEDDER:
            link = out / kind
            out.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() and link.resolve() != (artifacts / kind).resolve():
                link.unlink()
            if not link.exists():
                link.symlink_to((artifacts / kind).resolve(), target_is_directory=True)
            continue
        if (out / kind / "config.json").is_file():
            continue
        torch.manual_seed(0)
        model = MODEL_CLASSES[kind](artifact_config(artifacts / kind))
        export_model(kind, model, artifacts / kind / "tokenizer.json", out / kind)


def hf_model(kind: str, d: dict[str, Any]) -> Any:
    import transformers

    special = d["special_tokens"]
    if kind == "generator":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=d["vocab_size"], n_positions=d["max_positions"], n_embd=d["d_model"], n_layer=d["n_layers"],
            n_head=d["n_heads"], n_inner=d["d_ff"], activation_function="gelu",
            bos_token_id=special["bos"], eos_token_id=special["eos"], pad_token_id=special["pad"]))
    if kind == "translator":
        # Marian's pad token is its last one (the converter drops it again: one row more than ours), and its
        # zero embedding starts the decoder, as CTranslate2's start_from_zero_embedding does.
        return transformers.MarianMTModel(transformers.MarianConfig(
            vocab_size=d["vocab_size"] + 1, d_model=d["d_model"], encoder_layers=d["n_encoder_layers"],
            decoder_layers=d["n_decoder_layers"], encoder_attention_heads=d["n_heads"],
            decoder_attention_heads=d["n_heads"], encoder_ffn_dim=d["d_ff"], decoder_ffn_dim=d["d_ff"],
            max_position_embeddings=d["max_positions"], activation_function="relu", pad_token_id=d["vocab_size"],
            eos_token_id=special["eos"], bos_token_id=special["bos"], decoder_start_token_id=d["vocab_size"],
            forced_eos_token_id=None))
    bert = transformers.BertConfig(
        vocab_size=d["vocab_size"], hidden_size=d["d_model"], num_hidden_layers=d["n_layers"],
        num_attention_heads=d["n_heads"], intermediate_size=d["d_ff"], max_position_embeddings=d["max_positions"],
        type_vocab_size=2, num_labels=d["labels"], pad_token_id=special["pad"],
        position_embedding_type="absolute")  # transformers 5 dropped the field; CTranslate2 4.8 reads it
    if kind == EMBEDDER:  # the encoder alone (CTranslate2's converter wants its pooler too); pooled in the caller
        return transformers.BertModel(bert)
    return transformers.BertForSequenceClassification(bert)


def build_hf_and_ct2(artifacts: Path, work: Path, kinds: tuple[str, ...] = KINDS) -> None:
    """work/<kind>/hf: a saved random transformers model (+ a tokenizer made from ours); work/<kind>/ct2: converted."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    Converter = converter_class()
    transformers.logging.set_verbosity_error()
    for kind in kinds:
        hf_dir, ct2_dir = work / kind / "hf", work / kind / "ct2"
        if (ct2_dir / "model.bin").is_file():
            continue
        d = dims(artifacts / kind)
        raw = Tokenizer.from_file(str(artifacts / kind / "tokenizer.json"))
        names = {f"{k}_token": raw.id_to_token(v) for k, v in d["special_tokens"].items()
                 if k in ("pad", "eos", "bos", "unk", "cls", "sep", "mask")}
        names.setdefault("unk_token", names.get("eos_token", names["pad_token"]))  # CTranslate2 wants one
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(artifacts / kind / "tokenizer.json"),
                                                         **names)
        torch.manual_seed(0)
        model = hf_model(kind, d)
        model.save_pretrained(hf_dir)
        tokenizer.save_pretrained(hf_dir)
        if kind == "classifier":  # CTranslate2 converts BertModel; keep the head to apply it in numpy
            head = model.classifier
            np.savez(hf_dir / "head.npz", weight=head.weight.detach().numpy(), bias=head.bias.detach().numpy())
        Converter(str(hf_dir), kind == "translator").convert(str(ct2_dir), force=True)


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
                                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.copy_(tensor.half().float())
    model.save_pretrained(str(folder))


def build_llama(work: Path, size: str) -> Path:
    """The Llama-shaped checkpoint, its CTranslate2 conversion and our import of it (cached in `work`);
    returns the folder our server serves (it holds the artifact `llama`)."""
    from model.hf_artifact import import_to_artifact

    folder = llama_folder(work, size)
    hf_dir, ct2_dir, served = folder / "hf", folder / "ct2", llama_served(work, size)
    if not (hf_dir / "config.json").is_file():
        hf_dir.mkdir(parents=True, exist_ok=True)
        save_llama(hf_dir, size)
    if not (ct2_dir / "model.bin").is_file():
        converter_class()(str(hf_dir), False).convert(str(ct2_dir), force=True)
    if not (served / LLAMA / "config.json").is_file():
        import_to_artifact(hf_dir, served / LLAMA, LLAMA, license_="random weights", int8=False,
                           command=f"python -m scripts.import_checkpoint {hf_dir} --out {served / LLAMA} --no-int8")
    return served


def exporter_digest() -> str:
    """Of the sources an export depends on: a changed exporter or graph contract gets a fresh random export."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "model").rglob("*.py"), *(REPO / "service" / "contract").rglob("*.py")]):
        digest.update(path.relative_to(REPO).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def converter_class() -> type:
    import ctranslate2

    class Converter(ctranslate2.converters.TransformersConverter):  # type: ignore[misc]
        """For Marian, the vocabulary gets the `<pad>` the converter expects last (ours, at 0, is renamed)."""

        def __init__(self, path: str, marian: bool) -> None:
            super().__init__(path)
            self.marian = marian

        def load_tokenizer(self, tokenizer_class: Any, path: str, **kwargs: Any) -> Any:
            tokenizer = super().load_tokenizer(tokenizer_class, path, **kwargs)
            if not self.marian:
                return tokenizer
            tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
            tokens = [("<ours:pad>" if t == "<pad>" else t) for t in tokens] + ["<pad>"]
            return _Vocabulary(tokenizer, {t: i for i, t in enumerate(tokens)})

    return Converter


class _Vocabulary:
    def __init__(self, tokenizer: Any, vocab: dict[str, int]) -> None:
        self._tokenizer, self._vocab = tokenizer, vocab

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


# --- engines: one function per row, each running n requests as one batch ----------------------------------


def _encode(folder: Path, text: str) -> list[int]:
    """`text` as the model in `folder` tokenizes it; [] where that model is not among the rows' (not run)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    return Tokenizer.from_file(str(path)).encode(text).ids if path.is_file() else []


class Shapes:
    def __init__(self, args: argparse.Namespace, artifacts: Path) -> None:
        self.new_tokens, self.target_tokens = args.new_tokens, args.target_tokens
        self.prompt: list[int] = []  # a random prompt, where the generator is among the rows' models
        if (artifacts / "generator" / "config.json").is_file():
            vocab = dims(artifacts / "generator")["vocab_size"]
            self.prompt = [int(i) for i in np.random.default_rng(PROMPT_SEED).integers(10, vocab, args.prompt_tokens)]
        self.source = _encode(artifacts / "translator", SOURCE)
        self.text = _encode(artifacts / "classifier", TEXT)
        self.embed_text = _encode(artifacts / EMBEDDER, TEXT)  # the classifier's sentence, the embedder's tokens
        self.llama_size: str = args.llama_size
        rng = np.random.default_rng(PROMPT_SEED + 1)
        vocab = LLAMA_SIZES[self.llama_size]["vocab_size"]
        self.llama_prompt = [int(i) for i in rng.integers(len(LLAMA_SPECIALS), vocab, args.prompt_tokens)]
        # Prompts of other lengths for the agreement check of ours and CTranslate2.
        self.check_prompts = [[int(i) for i in rng.integers(len(LLAMA_SPECIALS), vocab, n)]
                              for n in np.linspace(2, max(2, args.prompt_tokens), CHECK_PROMPTS).astype(int)]

    def prompt_for(self, part: str) -> list[int]:
        return self.llama_prompt if part == LLAMA else self.prompt


# Which model (and compute type) each row runs on. Each (engine, part) pair gets a process of its own:
# with CTranslate2 4.8.5 here (AMD EPYC), loading an int8 model beside a float32 one halved the float32
# generator's speed, and after a translator batch in the same process it decoded one request 4x slower.
PARTS = {"generator_c16": "generator", "generator_c1": "generator", "generator_int8_c16": "generator-int8",
         "translator_beam4_c16": "translator", "translator_greedy_c16": "translator",
         "classifier_c32": "classifier", "classifier_c1": "classifier",
         "embedder_c32": EMBEDDER, "embedder_c1": EMBEDDER, "llama_c16": LLAMA, "llama_c1": LLAMA}


class CT2:
    """CTranslate2 on one converted model; token strings come from its vocabulary.json."""

    def __init__(self, work: Path, shapes: Shapes, threads: int, part: str) -> None:
        import ctranslate2

        kind, compute_type = part.removesuffix("-int8"), "int8" if part.endswith("-int8") else "float32"
        path = llama_folder(work, shapes.llama_size) / "ct2" if kind == LLAMA else work / kind / "ct2"
        vocab = json.loads(next(f for f in (path / "vocabulary.json", path / "shared_vocabulary.json")
                                if f.is_file()).read_text())
        self.s = shapes
        opts = {"device": "cpu", "intra_threads": threads, "inter_threads": 1, "compute_type": compute_type}
        self.vocab = vocab
        if kind in ("generator", LLAMA):
            self.prompt = [vocab[i] for i in shapes.prompt_for(kind)]
            self.generator = ctranslate2.Generator(str(path), **opts)
        elif kind == "translator":
            self.source, self.translator = [vocab[i] for i in shapes.source], ctranslate2.Translator(str(path), **opts)
        else:
            self.encoder = ctranslate2.Encoder(str(path), **opts)
            if kind == "classifier":
                head = np.load(work / "classifier" / "hf" / "head.npz")
                self.head_w, self.head_b = head["weight"].T.copy(), head["bias"]

    def generate(self, n: int) -> tuple[int, list[int]]:
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

    def translate(self, beams: int) -> Run:
        def run(n: int) -> tuple[int, list[int]]:
            out = self.translator.translate_batch(
                [self.source] * n, beam_size=beams, max_decoding_length=self.s.target_tokens,
                min_decoding_length=self.s.target_tokens, no_repeat_ngram_size=0, length_penalty=1.0)
            lengths = [len(r.hypotheses[0]) for r in out]
            return sum(lengths), lengths
        return run

    def classify(self, n: int) -> tuple[int, list[int]]:
        ids = [self.s.text] * n
        out = self.encoder.forward_batch(ids, token_type_ids=[[0] * len(self.s.text)] * n)
        logits = np.asarray(out.pooler_output) @ self.head_w + self.head_b
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return n, [0] * n

    def embed(self, n: int) -> tuple[int, list[int]]:
        ids = [self.s.embed_text] * n
        out = self.encoder.forward_batch(ids, token_type_ids=[[0] * len(self.s.embed_text)] * n)
        mean_pool(np.asarray(out.last_hidden_state), np.ones((n, len(self.s.embed_text)), np.float32))
        return n, [0] * n


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, S, D] hidden states, [B, S] mask -> [B, D] unit vectors: the embedder's mean pooling and normalize."""
    pooled = (hidden * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


class HF:
    """Eager PyTorch on one model: transformers' generate (greedy or beam search), or a plain forward."""

    def __init__(self, work: Path, shapes: Shapes, threads: int, part: str) -> None:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        torch.set_num_threads(threads)
        self.torch, self.s = torch, shapes
        cls = {"generator": transformers.GPT2LMHeadModel, "translator": transformers.MarianMTModel,
               "classifier": transformers.BertForSequenceClassification, EMBEDDER: transformers.BertModel}[part]
        self.model = cls.from_pretrained(work / part / "hf").eval()

    def generate(self, n: int) -> tuple[int, list[int]]:
        ids = self.torch.tensor([self.s.prompt] * n)
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=self.s.new_tokens, min_new_tokens=self.s.new_tokens)
        lengths = [out.shape[1] - ids.shape[1]] * n
        return sum(lengths), lengths

    def translate(self, beams: int) -> Run:
        def run(n: int) -> tuple[int, list[int]]:
            ids = self.torch.tensor([self.s.source] * n)
            with self.torch.inference_mode():
                out = self.model.generate(
                    ids, attention_mask=self.torch.ones_like(ids), num_beams=beams, do_sample=False,
                    max_new_tokens=self.s.target_tokens, min_new_tokens=self.s.target_tokens,
                    no_repeat_ngram_size=0, length_penalty=1.0, early_stopping=False)
            lengths = [out.shape[1] - 1] * n  # after the decoder start token
            return sum(lengths), lengths
        return run

    def classify(self, n: int) -> tuple[int, list[int]]:
        ids = self.torch.tensor([self.s.text] * n)
        with self.torch.inference_mode():
            self.model(input_ids=ids, attention_mask=self.torch.ones_like(ids),
                       token_type_ids=self.torch.zeros_like(ids)).logits.softmax(-1)
        return n, [0] * n

    def embed(self, n: int) -> tuple[int, list[int]]:
        ids = self.torch.tensor([self.s.embed_text] * n)
        mask = self.torch.ones_like(ids)
        with self.torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask, token_type_ids=self.torch.zeros_like(ids))
            real = mask.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
            pooled = (hidden.last_hidden_state * real).sum(1) / real.sum(1).clamp(min=1e-9)
            self.torch.nn.functional.normalize(pooled, dim=-1)
        return n, [0] * n


class Engine:
    """Our engine in process, without HTTP or the scheduler's thread: the model classes the server's worker
    drives (prefill, then steps until every sequence is done), on the served graphs, a batch per call as the
    others get. Beside the HTTP row it shows what is engine and what is the server around it."""

    def __init__(self, served: Path, shapes: Shapes, threads: int, part: str) -> None:
        from service.engine.classification import ClassificationModel
        from service.engine.embedding import EmbeddingModel
        from service.engine.generation import GenerationModel
        from service.engine.metrics import Metrics
        from service.engine.translation import TranslationModel
        from service.runtime.artifact import load_artifact
        from service.runtime.sessions import RuntimeOptions, artifact_sessions

        kind = part.removesuffix("-int8")
        artifact = load_artifact(served / kind)
        options = RuntimeOptions(device="cpu", intra_op_threads=threads,
                                 quantization="int8" if part.endswith("-int8") else "none")
        initializers = artifact.weights_package.load() if artifact.weights_package else None
        sessions = artifact_sessions(kind, artifact.graphs, options, initializers)
        tokenizer, metrics = artifact.load_tokenizer(), Metrics()
        self.s, self.prompt = shapes, shapes.prompt_for(kind)
        if kind in ("generator", LLAMA):
            self.model: Any = GenerationModel(kind, artifact, sessions["decoder"], tokenizer, metrics)
        elif kind == "translator":
            self.model = TranslationModel(kind, artifact, sessions["encoder"], sessions["decoder"], tokenizer, metrics)
        elif kind == EMBEDDER:
            self.model = EmbeddingModel(artifact, sessions["encoder"])
        else:
            self.model = ClassificationModel(artifact, sessions["encoder"], tokenizer)

    def _run(self, sequences: list[Any]) -> list[Any]:
        """Every sequence's final event, in order."""
        emits, batch = self.model.prefill(sequences)
        while batch is not None and batch.rows:
            emits += batch.step()
        final = {id(e.sequence): e.event for e in emits if e.final}
        return [final[id(seq)] for seq in sequences]

    def generate(self, n: int) -> tuple[int, list[int]]:
        from service.engine.generation import GenerationParams, GenerationSequence
        from service.engine.sampling import SamplingParams

        params = GenerationParams(self.s.new_tokens, SamplingParams(temperature=0.0), ignore_eos=True)
        lengths = [r.completion_tokens for r in self._run([GenerationSequence(self.prompt, params) for _ in range(n)])]
        return sum(lengths), lengths

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy tokens of each prompt up to the end token (not included), at most new_tokens."""
        from service.engine.generation import GenerationParams, GenerationSequence
        from service.engine.sampling import SamplingParams

        params = GenerationParams(self.s.new_tokens, SamplingParams(temperature=0.0))
        return [[t.id for t in r.tokens] for r in self._run([GenerationSequence(p, params) for p in prompts])]

    def translate(self, beams: int) -> Run:
        from service.engine.translation import TranslationParams, TranslationSequence

        params = TranslationParams(num_beams=beams, max_new_tokens=self.s.target_tokens, no_repeat_ngram_size=0)

        def run(n: int) -> tuple[int, list[int]]:
            sequences = [TranslationSequence(self.s.source, params, self.s.target_tokens) for _ in range(n)]
            lengths = [len(r.hypotheses[0].token_ids) for r in self._run(sequences)]
            return sum(lengths), lengths
        return run

    def classify(self, n: int) -> tuple[int, list[int]]:
        from service.engine.classification import ClassificationSequence, ClassifyItem

        item = ClassifyItem(self.s.text, [0] * len(self.s.text), False)
        self._run([ClassificationSequence(item, None) for _ in range(n)])
        return n, [0] * n

    def embed(self, n: int) -> tuple[int, list[int]]:
        from service.engine.embedding import EmbeddingSequence

        self._run([EmbeddingSequence(self.s.embed_text, True, None) for _ in range(n)])
        return n, [0] * n


def batched(run: Run, concurrency: int, requests: int) -> tuple[float, list[int]]:
    """Units per second over ceil(requests / concurrency) batches, after one untimed batch."""
    run(concurrency)
    units, lengths, started = 0, [], time.perf_counter()
    for _ in range(-(-requests // concurrency)):
        u, lens = run(concurrency)
        units, lengths = units + u, lengths + lens
    return units / (time.perf_counter() - started), lengths


def runs(engine: CT2 | HF | Engine, part: str) -> dict[str, Run]:
    """The batch function of each row of `part`."""
    table: dict[str, Callable[[], Run]] = {
        "generator_c16": lambda: engine.generate, "generator_c1": lambda: engine.generate,
        "generator_int8_c16": lambda: engine.generate, "translator_beam4_c16": lambda: engine.translate(4),
        "translator_greedy_c16": lambda: engine.translate(1), "classifier_c32": lambda: engine.classify,
        "classifier_c1": lambda: engine.classify, "embedder_c32": lambda: engine.embed,
        "embedder_c1": lambda: engine.embed, "llama_c16": lambda: engine.generate,
        "llama_c1": lambda: engine.generate}
    return {row: table[row]() for row, p in PARTS.items() if p == part}


def shape_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--target-tokens", type=int, default=30)
    parser.add_argument("--llama-size", choices=sorted(LLAMA_SIZES), default="bench",
                        help="dims of the Llama-shaped rows' model (built with random weights)")


def main() -> None:
    """Load one engine, then answer requests (the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("ct2", "hf", "engine"))
    parser.add_argument("part", choices=sorted(set(PARTS.values())))
    parser.add_argument("--artifacts", type=Path, required=True, help="our artifacts (tokenizers, dims)")
    parser.add_argument("--work", type=Path, required=True, help="where build_hf_and_ct2 saved the models")
    shape_options(parser)
    args = parser.parse_args()
    work = args.work
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    shapes = Shapes(args, args.artifacts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.engine == "engine":
            served = llama_served(work, args.llama_size) if args.part == LLAMA else args.artifacts
            engine: CT2 | HF | Engine = Engine(served, shapes, args.threads, args.part)
        else:
            engine = (HF if args.engine == "hf" else CT2)(work, shapes, args.threads, args.part)
        table_ = runs(engine, args.part)
    try:
        protocol.write(json.dumps({"ready": True}) + "\n")
        for line in sys.stdin:
            ask = json.loads(line)
            if "greedy" in ask:  # the agreement check: {"greedy": prompts} -> {"tokens": each one's tokens}
                protocol.write(json.dumps({"tokens": engine.greedy(ask["greedy"])}) + "\n")  # type: ignore[union-attr]
                continue
            value, lengths = batched(table_[ask["row"]], ask["concurrency"], ask["requests"])
            protocol.write(json.dumps({"value": value, "lengths": lengths}) + "\n")
    except BrokenPipeError:  # bench_anchor stopped (e.g. a server failed to start): its error is the one to read
        pass


if __name__ == "__main__":
    main()
