"""The Inference API's tasks of an embedding model on `POST /models/{name}`: feature-extraction (the pooled
vector of a text, a list of vectors for a list, as the API answers for sentence-transformers models) and
sentence-similarity (the cosine similarity of a source sentence to each of the others)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from fastapi import Request
from pydantic import ConfigDict, Field, RootModel

from service.api.deps import unless_disconnected
from service.api.native.schemas import (
    MAX_EMBEDDING_INPUTS,
    TRUNCATE_DOC,
    AnyCaseTruncationSide,
    Dimensions,
    Lenient,
    Text,
    bounded,
    truncation_side,
)
from service.engine.engine import Engine
from service.engine.tasks.embedding.service import Embedding, EmbeddingJob

MAX_INPUTS = MAX_EMBEDDING_INPUTS


class FeatureExtractionOptions(Lenient):
    # An empty or foreign `parameters` is what the other text tasks send: hf_tasks reads it as one of them.
    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "additionalProperties": False})

    normalize: bool | None = Field(None, description="default: the model's own (config.json normalize)")
    prompt_name: None = Field(None, description="not supported: this server's models have no prompts (must be null)")
    truncate: bool | None = Field(None, description=TRUNCATE_DOC)
    truncation_direction: AnyCaseTruncationSide | None = None
    dimensions: Dimensions = None
    encoding_format: Literal["float"] | None = Field(None, description="float only: the answer is JSON numbers")


class FeatureExtractionRequest(FeatureExtractionOptions):
    """The options at the top level, as the Inference API spec and huggingface_hub send them, or in
    `parameters`, as older clients do."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": "A sentence to embed.", "normalize": True}]})

    inputs: Text | Annotated[list[Text], bounded(MAX_INPUTS)]
    parameters: FeatureExtractionOptions | None = None

    def option(self, name: str) -> Any:
        value = getattr(self, name)
        return getattr(self.parameters, name) if value is None and self.parameters is not None else value


class SimilarityInputs(Lenient):
    source_sentence: Text
    sentences: Annotated[list[Text], bounded(MAX_INPUTS)]


class SentenceSimilarityRequest(Lenient):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"inputs": {"source_sentence": "A happy dog.", "sentences": ["A glad puppy.", "Taxes."]}}]
        }
    )

    inputs: SimilarityInputs
    parameters: dict[str, Any] | None = Field(None, description="none are defined; ignored")


class EmbeddingModelRequest(RootModel[FeatureExtractionRequest | SentenceSimilarityRequest]):
    """What an embedding model takes on POST /models/{name} (the OpenAPI document's body)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": ["A sentence to embed.", "Another."]}]})


async def _embeddings(engine: Engine, job: EmbeddingJob, request: Request) -> list[Embedding]:
    handle = await engine.submit(job)
    return await unless_disconnected(request, handle.results())


async def feature_extraction(engine: Engine, model: str, body: FeatureExtractionRequest, request: Request) -> Any:
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    fields = ["inputs"] if isinstance(body.inputs, str) else [f"inputs[{i}]" for i in range(len(texts))]
    direction = body.option("truncation_direction")
    job = EmbeddingJob(
        list(texts),
        fields,
        normalize=body.option("normalize"),
        truncate=bool(body.option("truncate")),
        truncation_direction=truncation_side(direction or "right"),
        dimensions=body.option("dimensions"),
        model=model,
    )
    vectors = [e.vector for e in await _embeddings(engine, job, request)]
    return vectors[0] if isinstance(body.inputs, str) else vectors


async def sentence_similarity(
    engine: Engine, model: str, body: SentenceSimilarityRequest, request: Request
) -> list[float]:
    given = body.inputs
    fields = ["inputs.source_sentence", *(f"inputs.sentences[{i}]" for i in range(len(given.sentences)))]
    job = EmbeddingJob([given.source_sentence, *given.sentences], fields, normalize=True, model=model)
    source, *others = (np.asarray(e.vector, dtype=np.float64) for e in await _embeddings(engine, job, request))
    return [float(source @ other) for other in others]
