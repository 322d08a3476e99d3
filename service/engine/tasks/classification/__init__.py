"""Classification: encoder models with a classification head (and rerankers, one label)."""
