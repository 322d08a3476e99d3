"""lm-evaluation-harness on the served generator: the run that tests/clients/test_lm_eval.py checks and
docs/clients.md's lm-eval figures come from this one module, so the page never holds figures by hand:

    python -m tests.clients.lm_eval_scores --doc      # a local server on artifacts/: writes
                                                      # bench_results/lm_eval.json and the docs block

Three tasks from the JSONL files in lm_eval_tasks/: perplexity (loglikelihood_rolling), multiple choice
(loglikelihood) and continuation (generate_until). The last one runs alone, with the server's prompt-token
counter read before and after: lm-eval sends a generate_until prompt cut to max_length - 1 - max_gen_toks
tokens, so MODEL_ARGS (docs/clients.md's command) must leave the prompts room."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import lm_eval
from lm_eval.tasks import TaskManager
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).resolve().parent / "lm_eval_tasks"
GENERATOR = REPO / "artifacts" / "generator"
SCORING_TASKS = ["sotu_perplexity", "sotu_choice"]
GENERATION_TASK = "sotu_continue"
# lm-eval's default max_gen_toks (256) is the generator's whole context: its generate_until requests
# would then slice each prompt to [1:] (max_length - 1 - 256 = -1), silently dropping the first token.
MAX_GEN_TOKS = 32
MODEL_ARGS = "base_url={url}/v1/completions,model=generator,max_length={max_length},max_gen_toks={max_gen_toks}"
DOC = REPO / "docs" / "clients.md"
DOC_BEGIN = "<!-- lm-eval:begin (python -m tests.clients.lm_eval_scores --doc) -->"
DOC_END = "<!-- lm-eval:end -->"
PROMPT_TOKENS = re.compile(r'^serve_prompt_tokens_total\{model="generator"\} (\S+)$', re.MULTILINE)


def model_args(url: str, max_length: int) -> str:
    return MODEL_ARGS.format(url=url, max_length=max_length, max_gen_toks=MAX_GEN_TOKS)


@dataclass
class Evaluation:
    scoring: dict[str, Any]  # lm-eval's results with samples, for SCORING_TASKS
    generation: dict[str, Any]  # the same for GENERATION_TASK
    prompt_tokens_received: int  # what the server counted while GENERATION_TASK ran


@contextmanager
def _offline_in_tasks_folder(cache: Path) -> Iterator[None]:
    """The datasets load from the JSONL files beside the YAML (relative paths: from that folder), and
    nothing may come from a hub."""
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache), "HF_HOME": str(cache)}
    saved = {k: os.environ.get(k) for k in env}
    cwd = Path.cwd()
    os.environ.update(env)
    os.chdir(TASKS)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def prompt_tokens(url: str) -> int:
    """The server's count of generation prompt tokens (its /metrics)."""
    found = PROMPT_TOKENS.search(httpx.get(f"{url}/metrics", timeout=30).text)
    return int(float(found.group(1))) if found else 0


def evaluate(url: str, max_length: int, cache: Path) -> Evaluation:
    def run(tasks: list[str]) -> dict[str, Any]:
        results: dict[str, Any] = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args(url, max_length),
            tasks=tasks,
            task_manager=TaskManager(include_path=str(TASKS)),
            log_samples=True,
        )
        return results

    with _offline_in_tasks_folder(cache):
        scoring = run(SCORING_TASKS)
        before = prompt_tokens(url)
        generation = run([GENERATION_TASK])
        received = prompt_tokens(url) - before
    return Evaluation(scoring, generation, received)


def contexts() -> list[str]:
    """The generate_until prompts: sotu_continue's contexts (its doc_to_text)."""
    return [json.loads(line)["context"] for line in (TASKS / "sotu_choice.jsonl").read_text().splitlines()]


def figures(evaluation: Evaluation) -> dict[str, Any]:
    """docs/clients.md's figures, from lm-eval's own results; token counts from the generator's tokenizer."""
    tokenizer = Tokenizer.from_file(str(GENERATOR / "tokenizer.json"))
    docs = [json.loads(line)["text"] for line in (TASKS / "sotu_test.jsonl").read_text().splitlines()]
    tokens = sum(len(tokenizer.encode(d, add_special_tokens=False).ids) for d in docs)
    loglikelihood = sum(float(s["filtered_resps"][0]) for s in evaluation.scoring["samples"]["sotu_perplexity"])
    perplexity = evaluation.scoring["results"]["sotu_perplexity"]
    choice = evaluation.scoring["results"]["sotu_choice"]
    sent = sum(len(tokenizer.encode(c, add_special_tokens=False).ids) for c in contexts())
    card = json.loads((GENERATOR / "card.json").read_text()).get("metrics", {})
    return {
        "perplexity_docs": len(docs),
        "perplexity_tokens": tokens,
        "word_perplexity": round(perplexity["word_perplexity,none"], 2),
        "byte_perplexity": round(perplexity["byte_perplexity,none"], 3),
        "token_perplexity": round(math.exp(-loglikelihood / tokens), 1),
        "card_test_perplexity": card.get("test_perplexity"),
        "choice_items": len(evaluation.scoring["samples"]["sotu_choice"]),
        "acc": round(choice["acc,none"], 3),
        "acc_norm": round(choice["acc_norm,none"], 3),
        "continue_prompts": len(contexts()),
        "continue_prompt_tokens": sent,
        "continue_prompt_tokens_received": evaluation.prompt_tokens_received,
        "max_gen_toks": MAX_GEN_TOKS,
    }


def doc_block(f: dict[str, Any]) -> str:
    text = (
        f"On the {f['perplexity_docs']} held-out State of the Union passages of `sotu_perplexity` "
        f"({f['perplexity_tokens']:,} tokens): word perplexity {f['word_perplexity']:.2f}, byte perplexity "
        f"{f['byte_perplexity']:.3f}, token perplexity {f['token_perplexity']:.1f} (the card's "
        f"{f['card_test_perplexity']} is over the whole 95.8k-token test split with 256-token windows at stride "
        f"128: a different text and windowing). On `sotu_choice` ({f['choice_items']} items, 4 choices: which "
        f"words really came next) the generator scores acc {f['acc']:.3f} (acc_norm {f['acc_norm']:.3f}; chance "
        f"0.25). `sotu_continue` (generate_until on the same {f['continue_prompts']} contexts, "
        f"max_gen_toks={f['max_gen_toks']}): the server received {f['continue_prompt_tokens_received']} prompt "
        f"tokens of the {f['continue_prompt_tokens']} the contexts have."
    )
    return f"{DOC_BEGIN}\n{textwrap.fill(text, 105, break_long_words=False, break_on_hyphens=False)}\n{DOC_END}"


def doc_figures_block(text: str) -> str | None:
    found = re.search(re.escape(DOC_BEGIN) + ".*?" + re.escape(DOC_END), text, re.DOTALL)
    return found.group() if found else None


def main() -> None:
    from harness.reliability.harness import LocalServer
    from tests.conftest import REAL_ARTIFACTS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, default=REPO / "bench_results" / "lm_eval.json")
    parser.add_argument("--doc", action="store_true", help="rewrite the figures in docs/clients.md")
    args = parser.parse_args()
    max_length = json.loads((GENERATOR / "config.json").read_text())["max_positions"]
    settings = {"SERVE_INTRA_OP_THREADS": "1", "SERVE_INTER_OP_THREADS": "1"}
    with LocalServer(REAL_ARTIFACTS, base=settings) as server:
        server.wait_ready(timeout=180)
        cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"lm-eval-cache-{os.getpid()}"
        result = figures(evaluate(server.url, max_length, cache))
    report = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "figures": result}
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if args.doc:
        text = DOC.read_text()
        if doc_figures_block(text) is None:
            raise SystemExit(f"{DOC} has no {DOC_BEGIN} ... {DOC_END} block")
        DOC.write_text(text.replace(doc_figures_block(text) or "", doc_block(result)))


if __name__ == "__main__":
    main()
