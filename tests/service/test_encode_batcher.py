"""service/engine/encode_batcher.py: requests that wait together are tokenized in one batch off the event loop,
each gets exactly what the tokenizer gives it alone, in order; one request alone is tokenized in place; a
request whose client left does not disturb the others; a failure reaches every request of its batch."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from tokenizers import Encoding, Tokenizer

from service.engine.encode_batcher import EncodeBatcher, TokenizerInput

TEXTS = ["a short text", "another, somewhat longer text with more words in it", "x"]
PAIR = ("the first sentence", "and the second one")


class Recording:
    """A real tokenizer that records each call: which method, how many inputs, on which thread."""

    def __init__(self, tokenizer: Tokenizer, fail: bool = False) -> None:
        self.tokenizer, self.fail = tokenizer, fail
        self.calls: list[tuple[str, int, str]] = []
        self.gate = threading.Event()  # encode_batch waits for it
        self.gate.set()

    def encode(self, sequence: str, pair: str | None = None, /) -> Encoding:
        self.calls.append(("encode", 1, threading.current_thread().name))
        return self.tokenizer.encode(sequence, pair)

    def encode_batch(self, inputs: list[TokenizerInput], /) -> list[Encoding]:
        self.calls.append(("encode_batch", len(inputs), threading.current_thread().name))
        self.gate.wait(timeout=10)
        if self.fail:
            raise RuntimeError("tokenizer failed")
        return self.tokenizer.encode_batch(inputs)


@pytest.fixture(scope="module")
def tokenizer(tiny_artifacts: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_artifacts / "classifier" / "tokenizer.json"))


def alone(tokenizer: Tokenizer, x: TokenizerInput) -> Encoding:
    return tokenizer.encode(*x) if isinstance(x, tuple) else tokenizer.encode(x)


def test_requests_that_wait_together_share_one_batch_off_the_loop(tokenizer: Tokenizer) -> None:
    recording = Recording(tokenizer)
    batcher = EncodeBatcher(recording)
    requests: list[list[TokenizerInput]] = [[TEXTS[0]], [TEXTS[1], TEXTS[2]], [PAIR]]

    async def main() -> list[list[Encoding]]:
        return await asyncio.gather(*(batcher.encode(r) for r in requests))

    results = asyncio.run(main())
    assert [(method, n) for method, n, _ in recording.calls] == [("encode_batch", 4)]
    assert recording.calls[0][2].startswith("encode-batch")  # the batcher's own thread, not the loop's
    for request, encodings in zip(requests, results, strict=True):
        assert [e.ids for e in encodings] == [alone(tokenizer, x).ids for x in request]
        assert [e.type_ids for e in encodings] == [alone(tokenizer, x).type_ids for x in request]
    assert not batcher.busy


def test_one_request_alone_is_tokenized_in_place(tokenizer: Tokenizer) -> None:
    recording = Recording(tokenizer)
    batcher = EncodeBatcher(recording)
    (encoding,) = asyncio.run(batcher.encode([TEXTS[1]]))
    assert encoding.ids == tokenizer.encode(TEXTS[1]).ids
    assert recording.calls == [("encode", 1, threading.main_thread().name)]


def test_arrivals_during_a_batch_join_the_next_and_a_cancelled_request_is_skipped(tokenizer: Tokenizer) -> None:
    recording = Recording(tokenizer)
    recording.gate.clear()
    batcher = EncodeBatcher(recording)

    async def main() -> list[list[Encoding]]:
        first = [asyncio.ensure_future(batcher.encode([text])) for text in TEXTS]
        while not recording.calls:  # until the first batch is on the thread
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(batcher.encode([text])) for text in reversed(TEXTS)]
        await asyncio.sleep(0.01)
        first[1].cancel()  # its client left while its batch ran
        recording.gate.set()
        await asyncio.gather(*first, return_exceptions=True)
        return [await r for r in (first[0], first[2], *later)]

    results = asyncio.run(main())
    assert [(method, n) for method, n, _ in recording.calls] == [("encode_batch", 3), ("encode_batch", 3)]
    expected = [TEXTS[0], TEXTS[2], *reversed(TEXTS)]
    assert [r[0].ids for r in results] == [tokenizer.encode(text).ids for text in expected]
    assert not batcher.busy


def test_a_failed_batch_fails_each_of_its_requests(tokenizer: Tokenizer) -> None:
    batcher = EncodeBatcher(Recording(tokenizer, fail=True))

    async def main() -> list[list[Encoding] | BaseException]:
        return await asyncio.gather(*(batcher.encode([text]) for text in TEXTS), return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and str(r) == "tokenizer failed" for r in results)
    assert not batcher.busy
