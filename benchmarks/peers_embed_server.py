"""The Python embedding server benchmarks/peers.py measures ours against: sentence-transformers behind FastAPI,
OpenAI's /v1/embeddings (mean pooling, normalised), run from .venv-peers. infinity-emb 0.0.78, the first choice,
cannot share that venv: it pins numpy<2, click<8.2 and uvicorn<0.33, which vLLM's CPU build does not take.

    .venv-peers/bin/python -m benchmarks.peers_embed_server CHECKPOINT NAME PORT THREADS
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class EmbeddingRequest(BaseModel):
    model: str
    input: str | list[str]


def app(checkpoint: str, name: str) -> FastAPI:
    encoder = SentenceTransformer(checkpoint, device="cpu")  # a plain BertModel folder: mean pooling
    served = FastAPI()

    @served.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @served.post("/v1/embeddings")
    def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        texts = [body.input] if isinstance(body.input, str) else body.input
        vectors = encoder.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "model": name, "data": data}

    return served


if __name__ == "__main__":
    checkpoint, model, port, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    uvicorn.run(app(checkpoint, model), host="127.0.0.1", port=port, log_level="warning")
