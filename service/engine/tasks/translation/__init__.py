"""Translation: encoder-decoder models, greedy, sampled or beam search, streamed or whole."""
