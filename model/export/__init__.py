"""Export: the ONNX graphs of each kind, int8 variants, golden records, tiny test models."""
