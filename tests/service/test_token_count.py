"""Counting a long text's tokens only until it is certainly past the limit (service/engine/token_count.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from service.engine.token_count import SLICE_CHARS, count_past

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
TEXT = "The Congress of the United States shall assemble at least once in every year.\n" * 4_000


@pytest.mark.parametrize("model", ["generator", "classifier-minilm", "translator"])
def test_a_long_text_is_refused_with_a_true_lower_bound(model: str) -> None:
    tokenizer = Tokenizer.from_file(str(ARTIFACTS / model / "tokenizer.json"))
    total = len(tokenizer.encode(TEXT, add_special_tokens=False))
    limit = total // 4
    past = count_past(tokenizer, TEXT, limit)
    assert past is not None and not past.exact
    assert limit < past <= total
    assert f"{past:,}".startswith("at least ") and str(past).startswith("at least ")
    # Under the limit (or too close to tell) the caller tokenizes the text whole.
    assert count_past(tokenizer, TEXT, total) is None


def test_a_text_without_whitespace_is_cut_inside_words() -> None:
    tokenizer = Tokenizer.from_file(str(ARTIFACTS / "generator" / "tokenizer.json"))
    text = "x" * (3 * SLICE_CHARS)
    total = len(tokenizer.encode(text, add_special_tokens=False))
    past = count_past(tokenizer, text, total // 4)
    assert past is not None and total // 4 < past <= total
