"""What the translation, generation and classification services share: the artifact, its tokenizer and
the settings, and how a validated job's sequences get their deadline and the field named in errors."""

from __future__ import annotations

import time
from typing import ClassVar, Generic

from service.engine.scheduler import Scheduler, SeqT
from service.runtime.artifact import Artifact
from service.settings import Settings


class TaskService(Generic[SeqT]):
    scheduler: Scheduler[SeqT]  # each service builds it once its model exists
    warmup_texts: ClassVar[tuple[str, ...]] = ()  # a short and a longer one, where warm-up runs texts

    def __init__(self, artifact: Artifact, settings: Settings) -> None:
        self.artifact = artifact
        self.name = artifact.name
        self.settings = settings
        self.tokenizer = artifact.load_tokenizer()

    def deadline(self) -> float:
        """When a job submitted now times out (SERVE_REQUEST_TIMEOUT_S), on time.monotonic()."""
        return time.monotonic() + self.settings.request_timeout_s

    def warmup_ids(self, limit: int) -> list[list[int]]:
        """The warm-up texts' token ids, truncated to `limit` tokens."""
        return [self.tokenizer.encode(text).ids[:limit] for text in self.warmup_texts]


def list_field(fields: list[str]) -> str:
    """The request field a job's items come from ("text" for "text[0]"), for the 422 about all of them."""
    return fields[0].partition("[")[0]
