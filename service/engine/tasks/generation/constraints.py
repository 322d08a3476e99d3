"""Constrained decoding: what a row may generate, as a grammar (a JSON schema, a regular expression, a list of
choices, a Lark grammar), compiled by llguidance against the model's tokenizer into a per-step token mask.

A request's `Constraint` is compiled once per distinct grammar and model (`Grammars.compile`, cached), on the
API side, so that a grammar llguidance refuses is the request's 422 before anything is queued; each row then
gets its own matcher (a copy of the compiled one), fills its row of the batch's bitmask before a token is
chosen (`fill_masks`) and consumes the token chosen. A row whose grammar is complete may only draw an end
token; a row whose matcher has no token left to allow ends (`finish_reason` "error")."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import llguidance
import llguidance.numpy
import numpy as np
from tokenizers import Tokenizer

from service.engine.errors import InvalidInput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

Kind = Literal["json", "regex", "choice", "grammar"]
CACHE_SIZE = 256  # compiled grammars kept per model
# Compact JSON: no whitespace between tokens, so a model cannot fill its budget with blanks.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match. `value`: a JSON schema (an object; `{"type": "object"}` for any
    JSON object), a regular expression, a list of strings, or a Lark grammar."""

    kind: Kind
    value: Any
    field: str  # the request field that asked for it, for errors

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.value], sort_keys=True, separators=(",", ":"))

    def grammar(self) -> str:
        """llguidance's grammar text; ValueError when the constraint cannot be one."""
        if self.kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(self.value, overrides=JSON_OPTIONS)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            lark = "start: " + " | ".join(json.dumps(str(choice)) for choice in self.value)
            return llguidance.LLMatcher.grammar_from_lark(lark)
        return llguidance.LLMatcher.grammar_from_lark(self.value)


class CompiledGrammar:
    """A grammar checked against the model's tokenizer; `Grammars.matcher` gives each row a fresh matcher.
    Pickled (to an engine process) without the matcher, which the other side rebuilds from `grammar`."""

    def __init__(self, key: str, grammar: str, prototype: llguidance.LLMatcher | None) -> None:
        self.key, self.grammar, self.prototype = key, grammar, prototype

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "grammar": self.grammar, "prototype": None}


class Grammars:
    """One model's grammar compiler: its tokenizer in llguidance's form (built on first use: it takes about a
    second for a large vocabulary) and the compiled grammars, least recently used dropped first."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, end_tokens: list[int]) -> None:
        self._tokenizer, self.vocab_size, self._end_tokens = tokenizer, vocab_size, end_tokens
        self._ll: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll is None:
                self._ll = llguidance.LLTokenizer(
                    self._tokenizer.to_str(), n_vocab=self.vocab_size, eos_token=self._end_tokens
                )
            return self._ll

    def _cached(self, key: str) -> CompiledGrammar | None:
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                self._compiled.move_to_end(key)
            return found

    def _keep(self, compiled: CompiledGrammar) -> CompiledGrammar:
        with self._lock:
            self._compiled[compiled.key] = compiled
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return compiled

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar (cached); InvalidInput naming the field when llguidance refuses it.
        Blocking (up to a few hundred ms for a large schema): call it off the event loop."""
        found = self._cached(constraint.key)
        if found is not None:
            return found
        tokenizer = self._ll_tokenizer()
        refused = f"the {constraint.kind} constraint cannot be used"
        try:
            grammar = constraint.grammar()
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise InvalidInput(f"{refused}: {exc}", constraint.field) from None
        if is_error:
            raise InvalidInput(f"{refused}: {'; '.join(messages)}", constraint.field)
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise InvalidInput(f"{refused}: {matcher.get_error()}", constraint.field)
        return self._keep(CompiledGrammar(constraint.key, grammar, matcher))

    def matcher(self, compiled: CompiledGrammar) -> llguidance.LLMatcher:
        """A fresh matcher for one row (one that came pickled from a front end is rebuilt here once)."""
        if compiled.prototype is None:
            found = self._cached(compiled.key)
            prototype = found.prototype if found is not None else None
            if prototype is None:
                prototype = llguidance.LLMatcher(self._ll_tokenizer(), compiled.grammar)
                self._keep(CompiledGrammar(compiled.key, compiled.grammar, prototype))
            compiled.prototype = prototype
        with self._lock:  # deep_copy reads the prototype, which other threads copy too
            return compiled.prototype.deep_copy()


_executor: llguidance.LLExecutor | None = None


def fill_masks(matchers: list[llguidance.LLMatcher | None], vocab_size: int) -> np.ndarray:
    """[B, V] bool: the tokens each row may draw next (every token for a row without a matcher); the rows'
    masks are computed in parallel on llguidance's own threads, without the GIL."""
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor()
    bits = llguidance.numpy.allocate_token_bitmask(len(matchers), vocab_size)
    rows = [(matcher, b) for b, matcher in enumerate(matchers) if matcher is not None]
    llguidance.numpy.fill_next_token_bitmask_par(_executor, rows, bits)
    allowed: np.ndarray = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
    return allowed.astype(bool)


# --- closing a structure before the budget ends --------------------------------------------------------------

# What closing prefers, one character at a time: a quote (ends a string, or opens the shortest value), then a
# bracket, then a separator. Tokens of several characters are taken only where nothing shorter is allowed.
_CLOSING_CHARACTERS = {'"': 3.0, "}": 2.5, "]": 2.5, ",": 0.5, ":": 0.25}
CLOSING_WINDOW = 64  # a row checks how far it is from closing its structure in its last this many tokens


def closing_scores(tokenizer: Tokenizer, vocab_size: int) -> np.ndarray:
    """[V] float32: how strongly closing a structure prefers each token (see _CLOSING_CHARACTERS); tokens past
    the tokenizer's vocabulary score lowest."""
    scores = np.full(vocab_size, -1e9, dtype=np.float32)
    for token in range(min(vocab_size, tokenizer.get_vocab_size())):
        text = tokenizer.decode([token], skip_special_tokens=False)
        scores[token] = _CLOSING_CHARACTERS.get(text, 0.0) if len(text) == 1 else -10.0 - len(text)
    return scores


def closing_token(allowed: np.ndarray, scores: np.ndarray, end_tokens: np.ndarray) -> int:
    """The token that closes: an end token once the grammar is complete, else the allowed token closing
    prefers most (the lowest id among ties, so that `steps_to_close` foresees the same path)."""
    ends = end_tokens[allowed[end_tokens]]
    if len(ends):
        return int(ends[0])
    return int(np.argmax(np.where(allowed, scores, -np.inf)))


def steps_to_close(matcher: llguidance.LLMatcher, scores: np.ndarray, end_tokens: np.ndarray, cap: int) -> int:
    """How many tokens closing the structure from here takes, end token included, counted on a copy of the
    matcher; `cap` when it takes at least that many."""
    probe = matcher.deep_copy()
    for step in range(cap):
        allowed = fill_masks([probe], len(scores))[0]
        if not allowed.any():
            return cap
        token = closing_token(allowed, scores, end_tokens)
        if token in end_tokens:
            return step + 1
        if not probe.consume_token(token):
            return cap
    return cap


class Closing:
    """One constrained row's watch on its budget: in its last CLOSING_WINDOW tokens it foresees how many
    closing its structure takes (`steps_to_close`), and closes from the token where closing takes about all
    that is left. Where the grammar is complete but allows more (a second tool call, another array item),
    going on must leave room to close again, or the row ends there.

    A token opens at most GROWTH levels (`[{"`), so the distance to closing grows by at most GROWTH a token:
    after an estimate the next one is due only when what is left could have met it, a few times per window."""

    GROWTH = 3
    MARGIN = 4  # tokens kept in hand

    def __init__(self) -> None:
        self.active = False
        self.narrowed = False  # closing took a token the grammar alone would not have forced
        self._next_check = CLOSING_WINDOW  # tokens left when the distance is estimated next

    def due(
        self, matcher: llguidance.LLMatcher, allowed: np.ndarray, left: int, scores: np.ndarray, end_tokens: np.ndarray
    ) -> bool:
        """Whether the row closes from this token (`allowed`: its grammar's mask now)."""
        if self.active or left > CLOSING_WINDOW:
            return self.active
        if allowed[end_tokens].any():
            self.active = _going_on(matcher, allowed, scores, end_tokens, left) + self.MARGIN >= left
            return self.active
        if left > self._next_check:
            return False
        estimate = steps_to_close(matcher, scores, end_tokens, left)
        self.active = estimate + self.MARGIN >= left
        # The distance after k more tokens is at most estimate + GROWTH * k; check again before it can reach
        # what will be left then (left - k).
        self._next_check = (estimate + self.MARGIN + self.GROWTH * left) // (self.GROWTH + 1)
        return self.active


def _going_on(
    matcher: llguidance.LLMatcher, allowed: np.ndarray, scores: np.ndarray, end_tokens: np.ndarray, cap: int
) -> int:
    """Tokens the cheapest way on from a complete grammar takes before it can end again (0: it cannot go on)."""
    others = allowed.copy()
    others[end_tokens] = False
    if not others.any():
        return 0
    probe = matcher.deep_copy()
    if not probe.consume_token(closing_token(others, scores, end_tokens)):
        return cap
    return 1 + steps_to_close(probe, scores, end_tokens, cap)
