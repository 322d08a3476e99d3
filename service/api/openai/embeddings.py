"""POST /v1/embeddings: OpenAI's embeddings API over the embedding models, so the `openai` SDK and LangChain's
`OpenAIEmbeddings` work as they are. Errors in OpenAI's shape (service/api/openai/errors.py)."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response as HttpResponse
from pydantic import ConfigDict, Field

from service.api.asgi.lean_route import LeanRoute
from service.api.deps import EngineDep, unless_disconnected
from service.api.native.schemas import MAX_EMBEDDING_INPUTS, Dimensions, EmbeddingInputs, Response
from service.api.native.schemas import Request as StrictRequest
from service.engine.tasks.embedding.service import Embedding, EmbeddingJob, EmbedInput

router = APIRouter(tags=["openai"], route_class=LeanRoute)

DEFAULT_MODEL = "default"  # also names the default embedding model, as an omitted `model` does


class EmbeddingRequest(StrictRequest):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"input": ["A sentence to embed.", "And another one."], "model": "embedder"}]}
    )

    input: EmbeddingInputs = Field(
        description=f"a text, a list of texts, token ids, or a list of token-id lists (at most {MAX_EMBEDDING_INPUTS})"
    )
    model: str | None = Field(
        None, description=f"an embedding model served here (GET /v1/models); omitted or {DEFAULT_MODEL!r}: the default"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's little-endian float32 bytes, as OpenAI's"
    )
    dimensions: Dimensions = None
    user: str | None = Field(None, description="accepted and ignored")


class EmbeddingData(Response):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Response):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Response):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def _inputs(body: EmbeddingRequest) -> tuple[list[EmbedInput], list[str]]:
    """The inputs and the request field of each: a lone text or id list is `input`, list items `input[i]`."""
    given = body.input
    if isinstance(given, str):
        return [given], ["input"]
    listed: list[str | list[int] | int] = [*given]
    ids = [x for x in listed if isinstance(x, int)]
    if len(ids) == len(listed):  # one input of token ids
        return [ids], ["input"]
    items: list[EmbedInput] = [x for x in listed if not isinstance(x, int)]
    return items, [f"input[{i}]" for i in range(len(items))]


def _encoded(e: Embedding, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(e.vector, dtype="<f4").tobytes()).decode("ascii")
    return e.vector


@router.post("/v1/embeddings", response_model=EmbeddingResponse, summary="OpenAI: embed texts or token ids")
async def embeddings(body: EmbeddingRequest, engine: EngineDep, request: Request) -> Any:
    inputs, fields = _inputs(body)
    model = None if body.model in (None, DEFAULT_MODEL) else body.model
    job = EmbeddingJob(inputs, fields, dimensions=body.dimensions, model=model)
    handle = await engine.submit(job)  # unknown model: 404 model_not_found
    results = await unless_disconnected(request, handle.results())
    tokens = sum(e.input_tokens for e in results)
    # EmbeddingResponse's shape, rendered by orjson: 32 x 384 floats cost json.dumps ~5 ms of the event loop
    # (~0.16 ms a vector), orjson ~0.25 ms, and the response model's validation of every float goes too.
    answer = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encoded(e, body.encoding_format)}
            for i, e in enumerate(results)
        ],
        "model": handle.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return HttpResponse(orjson.dumps(answer), media_type="application/json")
