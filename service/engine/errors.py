"""Engine errors. The API maps each to one HTTP status; the engine itself knows nothing about HTTP."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: `type` is the machine-readable name, `field` the request field at fault (if any)."""

    type = "engine_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(EngineError):
    """The request is well-formed JSON but cannot be served as asked (too long, out of range, ...)."""

    type = "invalid_input"


class QueueFull(EngineError):
    """The model's bounded queue has no room; retry after `retry_after_s`."""

    type = "queue_full"

    def __init__(self, message: str, retry_after_s: int = 1, field: str | None = None) -> None:
        super().__init__(message, field)
        self.retry_after_s = retry_after_s


class Unavailable(EngineError):
    """The engine is not serving (draining on shutdown, or stopped)."""

    type = "unavailable"


class ModelNotLoaded(EngineError):
    """The endpoint's model is not in SERVE_MODELS."""

    type = "model_not_loaded"


class RequestTimeout(EngineError):
    """The request did not finish within SERVE_REQUEST_TIMEOUT_S."""

    type = "timeout"


class InferenceFailed(EngineError):
    """ONNX Runtime failed while running a batch; every request in the batch gets this."""

    type = "inference_failed"
