"""Our engine in process for the anchor's `engine` column: the served graphs loaded as the server's worker
loads them, driven without HTTP or the scheduler's thread."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.anchor_shapes import Batch, Run, Setup

if TYPE_CHECKING:
    from service.runtime.artifact import Artifact


@dataclass
class Served:
    """One of our artifacts loaded as the server's worker loads it: the graphs' sessions, its tokenizer."""

    kind: str
    artifact: Artifact
    sessions: dict[str, Any]
    tokenizer: Any
    metrics: Any

    @classmethod
    def load(cls, folder: Path, threads: int, int8: bool = False) -> Served:
        from service.engine.metrics import Metrics
        from service.runtime.artifact import load_artifact
        from service.runtime.sessions import RuntimeOptions, artifact_sessions

        artifact = load_artifact(folder)
        options = RuntimeOptions(device="cpu", intra_op_threads=threads, quantization="int8" if int8 else "none")
        initializers = artifact.weights_package.load() if artifact.weights_package else None
        sessions = artifact_sessions(folder.name, artifact.graphs, options, initializers)
        return cls(folder.name, artifact, dict(sessions), artifact.load_tokenizer(), Metrics())


class _Ours:
    """Our engine in process, without HTTP or the scheduler's thread: the model classes the server's worker
    drives (prefill, then steps until every sequence is done), on the served graphs, a batch per call as the
    others get. Beside the HTTP row it shows what is engine and what is the server around it."""

    def __init__(self, setup: Setup, model: Any) -> None:
        self.s, self.model = setup.shapes, model

    def _run(self, sequences: list[Any]) -> list[Any]:
        """Every sequence's final event, in order."""
        emits, batch = self.model.prefill(sequences)
        while batch is not None and batch.rows:
            emits += batch.step()
        final = {id(e.sequence): e.event for e in emits if e.final}
        return [final[id(seq)] for seq in sequences]


class OursGenerator(_Ours):
    def __init__(self, setup: Setup, served: Served, prompt: list[int]) -> None:
        from service.engine.cache.in_place import InPlaceDecoder
        from service.engine.tasks.generation.decoding import GenerationModel
        from service.settings import Settings

        session, artifact = served.sessions["decoder"], served.artifact
        settings = Settings(max_input_tokens=artifact.max_positions, max_new_tokens=artifact.max_positions)
        in_place = InPlaceDecoder.for_session(served.kind, session, artifact, settings, served.metrics)
        super().__init__(setup, GenerationModel(served.kind, artifact, session, served.tokenizer, served.metrics,
                                                in_place))
        self.prompt = prompt

    def generate(self, n: int) -> Batch:
        from service.engine.tasks.generation.decoding import GenerationParams, GenerationSequence
        from service.engine.tokens.sampling import SamplingParams

        params = GenerationParams(self.s.new_tokens, SamplingParams(temperature=0.0), ignore_eos=True)
        lengths = [r.completion_tokens for r in self._run([GenerationSequence(self.prompt, params) for _ in range(n)])]
        return sum(lengths), lengths

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy tokens of each prompt up to the end token (not included), at most new_tokens."""
        from service.engine.tasks.generation.decoding import GenerationParams, GenerationSequence
        from service.engine.tokens.sampling import SamplingParams

        params = GenerationParams(self.s.new_tokens, SamplingParams(temperature=0.0))
        return [[t.id for t in r.tokens] for r in self._run([GenerationSequence(p, params) for p in prompts])]


class OursTranslator(_Ours):
    def __init__(self, setup: Setup, served: Served) -> None:
        from service.engine.tasks.translation.decoding import TranslationModel

        super().__init__(setup, TranslationModel(served.kind, served.artifact, served.sessions["encoder"],
                                                 served.sessions["decoder"], served.tokenizer, served.metrics))

    def translate(self, beams: int) -> Run:
        from service.engine.tasks.translation.decoding import TranslationParams, TranslationSequence

        params = TranslationParams(num_beams=beams, max_new_tokens=self.s.target_tokens, no_repeat_ngram_size=0)

        def run(n: int) -> Batch:
            sequences = [TranslationSequence(self.s.source, params, self.s.target_tokens) for _ in range(n)]
            lengths = [len(r.hypotheses[0].token_ids) for r in self._run(sequences)]
            return sum(lengths), lengths
        return run


class OursClassifier(_Ours):
    def __init__(self, setup: Setup, served: Served) -> None:
        from service.engine.tasks.classification.service import ClassificationModel

        super().__init__(setup, ClassificationModel(served.artifact, served.sessions["encoder"], served.tokenizer))

    def encode(self, n: int) -> Batch:
        from service.engine.tasks.classification.service import ClassificationSequence, ClassifyItem

        item = ClassifyItem(self.s.text, [0] * len(self.s.text), False)
        self._run([ClassificationSequence(item, None) for _ in range(n)])
        return n, [0] * n


class OursEmbedder(_Ours):
    def __init__(self, setup: Setup, served: Served) -> None:
        from service.engine.tasks.embedding.service import EmbeddingModel

        super().__init__(setup, EmbeddingModel(served.artifact, served.sessions["encoder"]))

    def encode(self, n: int) -> Batch:
        from service.engine.tasks.embedding.service import EmbeddingSequence

        self._run([EmbeddingSequence(self.s.embed_text, True, None) for _ in range(n)])
        return n, [0] * n
