"""Refusing a text past a token limit without tokenizing all of it.

A 900 KB prompt is ~200,000 tokens; its whole Encoding (ids, offsets, token strings) is ~15 MB and ~0.5 s of
tokenizing, all for a 422. Counted in slices cut at whitespace (where every tokenizer we load splits its
words), the count passes the limit after the first few slices, and no slice's Encoding is large."""

from __future__ import annotations

from tokenizers import Tokenizer

SLICE_CHARS = 32_768
# A cut at whitespace tokenizes as the whole text does, give or take a boundary token (a prefix space
# marker); a run of SLICE_CHARS without whitespace is cut in a word, which can cost a few more.
BOUNDARY_TOKENS = 8


class TokenCount(int):
    """A token count past a limit. `exact` false: counting stopped once the text was certainly past it."""

    exact: bool = True

    def __format__(self, spec: str) -> str:
        number = format(int(self), spec)
        return number if self.exact else f"at least {number}"

    def __str__(self) -> str:
        return format(self, "")


def count_past(tokenizer: Tokenizer, text: str, limit: int) -> TokenCount | None:
    """A lower bound on `text`'s tokens when it certainly has more than `limit`; None when it may not (the
    caller then tokenizes it whole). Worth calling only for texts much longer than SLICE_CHARS."""
    counted = slices = start = 0
    while start < len(text):
        end = _cut(text, start + SLICE_CHARS)
        # encode_batch releases the GIL (encode does not): this runs on a worker thread beside the event loop
        [encoding] = tokenizer.encode_batch([text[start:end]], add_special_tokens=False)
        counted += len(encoding)
        slices += 1
        start = end
        if counted - BOUNDARY_TOKENS * slices > limit:
            count = TokenCount(counted - BOUNDARY_TOKENS * slices)
            count.exact = False
            return count
    return None


def _cut(text: str, end: int) -> int:
    """`end`, moved back to the last whitespace in the slice's second half (a word is not cut) where one is."""
    if end >= len(text):
        return len(text)
    half = end - SLICE_CHARS // 2
    space = max(text.rfind(" ", half, end), text.rfind("\n", half, end))
    return space if space > 0 else end
