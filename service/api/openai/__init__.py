"""OpenAI's protocol: completions, chat completions, embeddings and models."""
