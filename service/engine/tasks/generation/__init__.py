"""Text generation: decoder-only models, prompts, chat templates, constraints, scoring."""
