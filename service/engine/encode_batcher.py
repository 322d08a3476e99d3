"""Short texts of requests that arrive together are tokenized together, off the event loop.

A request that finds the model idle is tokenized in place by its service (no hand-off: the hot path of one
client at a time); the others come here. One of them alone is still tokenized in place; when several wait,
one `encode_batch` call on a thread of its own tokenizes all their texts: the Rust tokenizer releases the
GIL for it, so the event loop goes on parsing and answering meanwhile. While a batch runs, the
requests that arrive join the next one, so the batches grow with the load and the hand-off is paid once per
batch, not per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from tokenizers import Encoding

TokenizerInput = str | tuple[str, str]  # a text, or a sentence pair


class BatchTokenizer(Protocol):
    """What the batcher asks of a tokenizer (a `tokenizers.Tokenizer`)."""

    def encode(self, sequence: str, pair: str | None = None, /) -> Encoding: ...

    def encode_batch(self, inputs: list[TokenizerInput], /) -> list[Encoding]: ...


@dataclass(frozen=True)
class _Waiting:
    inputs: Sequence[TokenizerInput]
    done: asyncio.Future[list[Encoding]]


class EncodeBatcher:
    def __init__(self, tokenizer: BatchTokenizer) -> None:
        self.tokenizer = tokenizer
        self._waiting: list[_Waiting] = []
        self._flush_soon = False  # a flush is scheduled for the loop's next turn
        self._running = False  # a batch is on the thread; arrivals wait for the next one
        self._thread: ThreadPoolExecutor | None = None  # made on first use

    @property
    def busy(self) -> bool:
        """Requests are waiting here or a batch is on the thread."""
        return bool(self._waiting) or self._flush_soon or self._running

    async def encode(self, inputs: Sequence[TokenizerInput]) -> list[Encoding]:
        """Each input's Encoding with the tokenizer's special tokens, in order."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Encoding]] = loop.create_future()
        self._waiting.append(_Waiting(inputs, done))
        if not self._flush_soon and not self._running:
            self._flush_soon = True
            loop.call_soon(self._flush)  # after the other requests that this turn of the loop started
        return await done

    def _flush(self) -> None:
        self._flush_soon = False
        batch, self._waiting = self._waiting, []
        if len(batch) == 1:  # alone: in place, no thread hand-off (nor the batch machinery for its few texts)
            _settle(batch, lambda: [[self._one(x) for x in batch[0].inputs]])
            return
        self._running = True
        self._thread = self._thread or ThreadPoolExecutor(1, thread_name_prefix="encode-batch")
        work = asyncio.get_running_loop().run_in_executor(self._thread, self._encode, [w.inputs for w in batch])
        work.add_done_callback(lambda finished: self._finished(batch, finished))

    def _finished(self, batch: list[_Waiting], work: asyncio.Future[list[list[Encoding]]]) -> None:
        self._running = False
        _settle(batch, work.result)
        if self._waiting:  # arrived while the batch ran
            self._flush()

    def _encode(self, requests: list[Sequence[TokenizerInput]]) -> list[list[Encoding]]:
        encodings = iter(self.tokenizer.encode_batch([x for inputs in requests for x in inputs]))
        return [[next(encodings) for _ in inputs] for inputs in requests]

    def _one(self, x: TokenizerInput) -> Encoding:
        return self.tokenizer.encode(*x) if isinstance(x, tuple) else self.tokenizer.encode(x)


def _settle(batch: list[_Waiting], results: Callable[[], list[list[Encoding]]]) -> None:
    """Each waiting request gets its encodings, or the error; a request whose client left is skipped."""
    try:
        encodings = results()
    except Exception as exc:
        for w in batch:
            if not w.done.done():
                w.done.set_exception(exc)
        return
    for w, encoded in zip(batch, encodings, strict=True):
        if not w.done.done():
            w.done.set_result(encoded)
