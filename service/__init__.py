"""The inference service: FastAPI on ONNX Runtime (see service.app:create_app and `python -m service`)."""
