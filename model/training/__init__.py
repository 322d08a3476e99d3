"""Training: the loop, packed runs, tokenizers, model cards and their baselines."""
