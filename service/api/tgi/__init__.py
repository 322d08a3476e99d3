"""Text Generation Inference's protocol: /generate and /generate_stream."""
