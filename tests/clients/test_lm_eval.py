"""lm-evaluation-harness (`local-completions`, default tokenizer backend, which finds the server's
/tokenizer_info and /tokenize) on three small local tasks from JSONL files: perplexity
(loglikelihood_rolling), multiple choice and continuation (generate_until), run as docs/clients.md says
(tests/clients/lm_eval_scores.py). Its numbers must match the generator's own, computed the same way
(same windows, same token boundaries) with ONNX Runtime directly on the exported graph; generate_until
prompts must reach the server whole; docs/clients.md's figures must be this run's."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tokenizers import Tokenizer

from tests.clients import lm_eval_scores
from tests.clients.conftest import Server
from tests.clients.lm_eval_scores import TASKS, Evaluation
from tests.conftest import REAL_ARTIFACTS

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
        decoder = str(GENERATOR / "decoder.onnx")
        self.session = ort.InferenceSession(decoder, options, providers=["CPUExecutionProvider"])

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
        chosen: np.ndarray = logprobs[np.arange(len(ids) - 1), ids[1:]]
        return chosen

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
        pairs = map(make_disjoint_window, windows)
        return sum(self.continuation(context, continuation, max_length) for context, continuation in pairs)


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


@pytest.fixture(scope="module")
def run(server: Server, tmp_path_factory: pytest.TempPathFactory, reference: Reference) -> Evaluation:
    """One lm-eval run of the three tasks, with docs/clients.md's model arguments."""
    return lm_eval_scores.evaluate(server.url, reference.max_positions, tmp_path_factory.mktemp("hf-cache"))


def test_perplexity_matches_the_generator(run: Evaluation, reference: Reference) -> None:
    evaluation = run.scoring
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


def test_multiple_choice_matches_the_generator(run: Evaluation, reference: Reference) -> None:
    evaluation = run.scoring
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
    acc, acc_norm = metrics["acc,none"], metrics["acc_norm,none"]
    print(f"\nlm-eval sotu_choice: acc {acc:.3f}, acc_norm {acc_norm:.3f} (chance 0.25)")


def test_generate_until_prompts_arrive_whole(run: Evaluation, reference: Reference) -> None:
    """lm-eval cuts each generate_until prompt to max_length - 1 - max_gen_toks tokens from its end, and with
    its default max_gen_toks (256, the whole context) to [1:]: docs/clients.md's arguments must leave room."""
    sent = sum(len(reference.encode(c)) for c in lm_eval_scores.contexts())
    assert run.prompt_tokens_received == sent
    assert len(run.generation["samples"][lm_eval_scores.GENERATION_TASK]) == len(lm_eval_scores.contexts())


def test_the_docs_show_this_run(run: Evaluation, reference: Reference) -> None:
    """docs/clients.md's command is the one tested, and its figures are this generator's (they were written by
    `python -m tests.clients.lm_eval_scores --doc`, never by hand)."""
    doc = lm_eval_scores.DOC.read_text()
    assert lm_eval_scores.model_args("http://localhost:8000", reference.max_positions) in doc
    expected = lm_eval_scores.doc_block(lm_eval_scores.figures(run))
    assert lm_eval_scores.doc_figures_block(doc) == expected, "run python -m tests.clients.lm_eval_scores --doc"
