"""Hugging Face's Inference API: POST / and /models/{name}, by task."""
