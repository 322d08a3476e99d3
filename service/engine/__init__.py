"""Serving engine: batching, scheduling, decoding, sampling. Never imports fastapi."""
