"""The networks: layers, configs, the translator, generator, classifier and embedder, reference decoding."""
