"""lm-evaluation-harness (`local-completions`, default tokenizer backend, which finds the server's
/tokenizer_info and /tokenize) on two small local tasks from JSONL files: perplexity
(loglikelihood_rolling) and multiple choice. Its numbers must match the generator's own, computed the
same way (same windows, same token boundaries) with ONNX Runtime directly on the exported graph."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lm_eval
import numpy as np
import onnxruntime as ort
import pytest
from lm_eval.tasks import TaskManager
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tokenizers import Tokenizer

from tests.clients.conftest import Server
from tests.conftest import REAL_ARTIFACTS

TASKS = Path(__file__).resolve().parent / "lm_eval_tasks"
GENERATOR = REAL_ARTIFACTS / "generator"


class Reference:
    """The generator's log-probabilities straight from its ONNX graph: one uncached pass per input."""

    def __init__(self) -> None:
        config = json.loads((GENERATOR / "config.json").read_text())
        self.max_positions = config["max_positions"]
        self.eos = config["special_tokens"]["eos"]
        self.tokenizer = Tokenizer.from_file(str(GENERATOR / "tokenizer.json"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(GENERATOR / "decoder.onnx"), options, providers=["CPUExecutionProvider"])

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def next_token_logprobs(self, ids: list[int]) -> np.ndarray:
        """[len(ids) - 1]: the logprob of ids[i + 1] given ids[: i + 1]."""
        feeds: dict[str, Any] = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None],
        }
        for spec in self.session.get_inputs():
            if spec.name.startswith("past_key_values"):
                feeds[spec.name] = np.zeros((1, spec.shape[1], 0, spec.shape[3]), dtype=np.float32)
        logits = self.session.run(["logits"], feeds)[0][0].astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        logprobs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        return logprobs[np.arange(len(ids) - 1), ids[1:]]

    def continuation(self, context: list[int], continuation: list[int], max_length: int) -> float:
        """As lm-eval's API models score (context, continuation): left-truncated to `max_length` tokens
        (lm-eval's own max_length, one less than the model argument: one position is for generation)."""
        whole = (context + continuation)[-max_length:]
        n = len(continuation)
        return float(self.next_token_logprobs(whole)[-n:].sum())

    def rolling(self, text: str, max_length: int) -> float:
        windows = get_rolling_token_windows(
            token_list=self.encode(text), prefix_token=self.eos, max_seq_len=max_length - 1, context_len=1
        )
        return sum(self.continuation(*make_disjoint_window(w), max_length) for w in windows)


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


@pytest.fixture(scope="module")
def evaluation(server: Server, tmp_path_factory: pytest.TempPathFactory, reference: Reference) -> Iterator[dict]:
    """One lm-eval run of both tasks. The datasets load from the JSONL files beside the YAML (relative
    paths: run from that folder) and nothing may come from a hub."""
    cache = tmp_path_factory.mktemp("hf-cache")
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache), "HF_HOME": str(cache)}
    saved = {k: os.environ.get(k) for k in env}
    cwd = Path.cwd()
    os.environ.update(env)
    os.chdir(TASKS)
    try:
        yield lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"base_url={server.url}/v1/completions,model=generator,max_length={reference.max_positions}",
            tasks=["sotu_perplexity", "sotu_choice"],
            task_manager=TaskManager(include_path=str(TASKS)),
            log_samples=True,
        )
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_perplexity_matches_the_generator(evaluation: dict, reference: Reference) -> None:
    lm_max = reference.max_positions - 1
    docs = [json.loads(line)["text"] for line in (TASKS / "sotu_test.jsonl").read_text().splitlines()]
    ours = [reference.rolling(doc, lm_max) for doc in docs]
    samples = sorted(evaluation["samples"]["sotu_perplexity"], key=lambda s: s["doc_id"])
    theirs = [float(s["filtered_resps"][0]) for s in samples]
    assert len(theirs) == len(docs)
    for doc, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert math.isclose(a, b, rel_tol=1e-3), (doc, a, b)

    total = sum(ours)
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    size = sum(len(d.encode("utf-8")) for d in docs)
    tokens = sum(len(reference.encode(d)) for d in docs)
    metrics = evaluation["results"]["sotu_perplexity"]
    assert math.isclose(metrics["word_perplexity,none"], math.exp(-total / words), rel_tol=0.01)
    assert math.isclose(metrics["byte_perplexity,none"], math.exp(-total / size), rel_tol=0.01)
    assert math.isclose(metrics["bits_per_byte,none"], -total / size / math.log(2), rel_tol=0.01)
    print(
        f"\nlm-eval sotu_perplexity: word {metrics['word_perplexity,none']:.2f}, byte "
        f"{metrics['byte_perplexity,none']:.4f}; token perplexity (ONNX reference) {math.exp(-total / tokens):.2f}"
    )


def test_multiple_choice_matches_the_generator(evaluation: dict, reference: Reference) -> None:
    lm_max = reference.max_positions - 1
    docs = [json.loads(line) for line in (TASKS / "sotu_choice.jsonl").read_text().splitlines()]
    samples = sorted(evaluation["samples"]["sotu_choice"], key=lambda s: s["doc_id"])
    assert len(samples) == len(docs)
    correct = correct_norm = 0
    for doc, sample in zip(docs, samples, strict=True):
        scores = []
        for choice in doc["choices"]:
            # lm-eval's split: the context's tokens, then the rest of the whole string's tokens.
            context = reference.encode(doc["context"])
            whole = reference.encode(doc["context"] + " " + choice)
            scores.append(reference.continuation(context, whole[len(context) :], lm_max))
        theirs = [float(r[0]) for r in sample["filtered_resps"]]
        assert np.allclose(scores, theirs, rtol=1e-3, atol=1e-3), (doc, scores, theirs)
        correct += int(np.argmax(scores)) == doc["label"]
        lengths = [len((" " + c).encode("utf-8")) for c in doc["choices"]]
        correct_norm += int(np.argmax(np.asarray(scores) / lengths)) == doc["label"]
    metrics = evaluation["results"]["sotu_choice"]
    assert metrics["acc,none"] == pytest.approx(correct / len(docs))
    assert metrics["acc_norm,none"] == pytest.approx(correct_norm / len(docs))
    print(f"\nlm-eval sotu_choice: acc {metrics['acc,none']:.3f}, acc_norm {metrics['acc_norm,none']:.3f} (chance 0.25)")
