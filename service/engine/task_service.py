"""What the translation, generation and classification services share: the artifact, its tokenizer and
the settings, how a job's texts are tokenized without stalling the event loop, and how a validated job's
sequences get their deadline and the field named in errors."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, Generic, Literal, Protocol, TypeVar

from tokenizers import Encoding, Tokenizer

from service.engine.capabilities import Capabilities
from service.engine.scheduling import SequenceQueue
from service.engine.sequence import SeqT
from service.engine.token_count import TokenCount, count_past
from service.runtime.artifact import Artifact
from service.settings import Settings

T = TypeVar("T")

TokenizerInput = str | tuple[str, str]  # a text, or a sentence pair
TruncationDirection = Literal["right", "left"]  # which end of a text past the limit is cut

# Tokenizing costs ~0.3-0.5 ms per 1,000 characters, and `encode` holds the GIL: a request whose texts
# total up to this many characters is tokenized in place (~2 ms at most, no thread hand-off on the hot
# path); a longer one on a worker thread with `encode_batch`, which releases the GIL, so a 900 KB prompt
# (~0.5 s of tokenizing) does not stall /health and other requests' streams before its 422.
INLINE_TOKENIZE_CHARS = 4_096
# Past this many characters the heap goes back to the OS once the tokenizer work is done (as /tokenize).
LARGE_TOKENIZE_CHARS = 65_536


class TokenizerWork(Protocol):
    """Where long texts are tokenized: the API's bounded worker slots (service/api/asgi/worker_slots.py), which
    /tokenize shares; a plain worker thread where the engine is driven directly (warm-up, tests)."""

    async def run(self, fn: Callable[[], T], large: bool = False) -> T: ...


class ThreadWork:
    async def run(self, fn: Callable[[], T], large: bool = False) -> T:
        return await asyncio.to_thread(fn)


class TaskService(ABC, Generic[SeqT]):
    task: ClassVar[str]  # config.json "task" of the models it serves
    scheduler: SequenceQueue[SeqT]  # each service builds its Scheduler once its model exists
    warmup_texts: ClassVar[tuple[str, ...]] = ()  # a short and a longer one, where warm-up runs texts
    tokenizer_work: TokenizerWork = ThreadWork()  # the engine hands every service the server's

    def __init__(self, artifact: Artifact, settings: Settings) -> None:
        self.artifact = artifact
        self.name = artifact.name
        self.settings = settings
        self.tokenizer = artifact.load_tokenizer()
        self._truncating: dict[tuple[int, str], Tokenizer] = {}

    @abstractmethod
    async def warmup(self) -> None:
        """Run a few representative batches (first-run allocations, thread pools)."""

    def capabilities(self) -> Capabilities:
        """What the protocols may ask of this model; each task adds its own."""
        a = self.artifact
        return Capabilities(self.name, a.task, a, self.tokenizer, min(self.settings.max_input_tokens, a.max_positions))

    def truncating_tokenizer(self, limit: int, direction: TruncationDirection) -> Tokenizer:
        """A copy of the tokenizer that cuts its encodings to `limit` tokens, special tokens included (a pair:
        the longer text first), as TEI's `truncate` does; built once per limit and direction."""
        key = (limit, direction)
        if key not in self._truncating:
            tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
            tokenizer.enable_truncation(limit, direction=direction)
            self._truncating[key] = tokenizer
        return self._truncating[key]

    def encode_now(
        self,
        inputs: Sequence[TokenizerInput],
        limit: int | None,
        batch: bool = False,
        truncation: TruncationDirection | None = None,
        add_special_tokens: bool = True,
    ) -> list[Encoding | int]:
        """Each input's Encoding; past `limit` tokens only its token count (a long text's counted only until it is
        certainly past: service/engine/token_count.py), the Encoding freed here (on a worker
        thread: a refused 900 KB text's ~15 MB is gone before the heap is trimmed, not held by the 422's
        traceback), or cut to `limit` from the `truncation` side. `batch`: with encode_batch, which releases
        the GIL (for worker threads). `add_special_tokens` false: the text already holds them (a chat template's
        rendering)."""
        tokenizer = self.tokenizer
        if truncation is not None and limit is not None:
            tokenizer = self.truncating_tokenizer(limit, truncation)
        past: dict[int, TokenCount] = {}
        if limit is not None and truncation is None:
            for i, x in enumerate(inputs):
                if isinstance(x, str) and len(x) > LARGE_TOKENIZE_CHARS:
                    count = count_past(tokenizer, x, limit)
                    if count is not None:
                        past[i] = count
        whole = [x for i, x in enumerate(inputs) if i not in past]
        if batch:
            encodings = iter(tokenizer.encode_batch(whole, add_special_tokens=add_special_tokens))
        else:  # no batch machinery (rayon) for the short texts of the hot path
            encode, add = tokenizer.encode, add_special_tokens
            encodings = iter(
                [
                    encode(*x, add_special_tokens=add) if isinstance(x, tuple) else encode(x, add_special_tokens=add)
                    for x in whole
                ]
            )
        encoded = [past[i] if i in past else next(encodings) for i in range(len(inputs))]
        return [e if isinstance(e, int) or limit is None or len(e) <= limit else len(e) for e in encoded]

    async def encode(
        self,
        inputs: Sequence[TokenizerInput],
        limit: int | None,
        truncation: TruncationDirection | None = None,
        add_special_tokens: bool = True,
    ) -> list[Encoding | int]:
        """`encode_now`: in place for short texts, on the tokenizer worker slots for long ones."""
        chars = sum(len(x) if isinstance(x, str) else len(x[0]) + len(x[1]) for x in inputs)
        if chars <= INLINE_TOKENIZE_CHARS:
            return self.encode_now(inputs, limit, truncation=truncation, add_special_tokens=add_special_tokens)
        large = chars > LARGE_TOKENIZE_CHARS
        return await self.tokenizer_work.run(
            lambda: self.encode_now(inputs, limit, True, truncation, add_special_tokens), large=large
        )

    def deadline(self) -> float:
        """When a job submitted now times out (SERVE_REQUEST_TIMEOUT_S), on time.monotonic()."""
        return time.monotonic() + self.settings.request_timeout_s

    def warmup_ids(self, limit: int) -> list[list[int]]:
        """The warm-up texts' token ids, truncated to `limit` tokens."""
        return [self.tokenizer.encode(text).ids[:limit] for text in self.warmup_texts]


def too_long(tokens: int, limit: int) -> str:
    """The 422 for an encoder input past the limit."""
    return f"the input has {tokens} tokens; the limit is {limit} (ask for truncation to cut it)"


def list_field(fields: list[str]) -> str:
    """The request field a job's items come from ("text" for "text[0]"), for the 422 about all of them."""
    return fields[0].partition("[")[0]
