"""Importing Hugging Face checkpoints: configs, weights, tokenizers, parity with transformers."""
