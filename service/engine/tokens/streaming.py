"""Incremental detokenization that never splits a UTF-8 character and never leaks a stop string.

Byte-level BPE tokens can end in the middle of a character; decoding them alone gives U+FFFD. We decode
a small window of ids (TGI's prefix/read offsets) and hold the text back until it no longer ends in
U+FFFD. Text that could be the start of a stop string is held back too, until it can no longer match.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window re-decoded for context (spaces, merges)
        self.read_offset = 0  # ids before this are already released as text

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=True)

    def push(self, token: int) -> str:
        """Add one id; return the newly completed text (possibly empty)."""
        self.ids.append(token)
        prefix = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset)
        if len(text) > len(prefix) and not text.endswith(REPLACEMENT):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (at the end of a sequence an invalid byte stays U+FFFD)."""
        prefix = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset)
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]


class TextStream:
    """Decoded text of one generated sequence, released in safe pieces; detects stop strings."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop = [s for s in stop if s]
        self.text = ""
        self.released = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.text += self.decoder.push(token)
        return self._release(final=False)

    def finish(self) -> str:
        """Release the rest at the end of the sequence."""
        if not self.stopped:
            self.text += self.decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        hits = [i for i in (self.text.find(s, self.released) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            end = len(self.text)
        else:
            end = len(self.text) if final else len(self.text) - self._partial_stop()
        piece = self.text[self.released : end]
        self.released = end
        return piece

    def _partial_stop(self) -> int:
        """Length of the longest unreleased suffix that is a proper prefix of a stop string."""
        tail = self.text[self.released :]
        best = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(tail)), best, -1):
                if tail.endswith(stop[:n]):
                    best = n
                    break
        return best
