"""A decoder's key/value cache, two ways.

- appended.py: the graph returns past + new (our own generator and translator, imports with --kv-cache appended);
  the engine stacks and slices the rows (left padded).
- in_place.py, slots.py: the graph writes the new tokens' keys and values into slot buffers the engine owns
  (imported decoders); prefix.py keeps prompts' blocks for reuse; budget.py bounds the memory they take.
"""
