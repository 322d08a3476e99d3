"""Text Embeddings Inference's protocol: /embed and /rerank."""
