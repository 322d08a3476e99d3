"""HTTP layer: routes and schemas. Talks to the engine only; never touches ONNX tensors."""
