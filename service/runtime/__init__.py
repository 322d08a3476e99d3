"""ONNX Runtime sessions and the artifact contract."""
