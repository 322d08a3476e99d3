"""What one served model can do, as every protocol asks it: the HTTP layer reads this view and submits jobs,
and never learns which service class runs the model."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from service.runtime.artifact import Artifact


@dataclass(frozen=True)
class Capabilities:
    name: str  # the served name
    task: str  # config.json "task" (contract/kinds.py)
    artifact: Artifact  # its config.json, read
    tokenizer: Tokenizer  # for the tokenizer routes and the token texts of logprobs
    max_input_tokens: int  # the longest input it takes (a generator: its prompt)
    labels: tuple[str, ...] = ()  # a classifier's classes (one: a cross-encoder's relevance score)
    chat_template: str | None = None  # a generator's chat template source: it can answer chat messages
    end_id: int | None = None  # a generator's end token
    dimensions: int | None = None  # an embedder's vector size
    max_target_tokens: int | None = None  # the longest translation a translator writes

    @property
    def reranks(self) -> bool:
        """A one-label classifier scores (query, text) pairs: TEI's /rerank."""
        return len(self.labels) == 1
