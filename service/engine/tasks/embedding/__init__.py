"""Embeddings: encoder models pooled to one vector per text."""
