"""Which loaded model a request means: by name, or the default one (the generator where it is loaded,
as the protocols that name no model — TGI, vLLM's tokenizer routes — are about text generation)."""

from __future__ import annotations

from service.api.errors import ApiError
from service.engine.engine import Engine, Service
from service.engine.errors import ModelNotLoaded


def services(engine: Engine) -> dict[str, Service]:
    loaded = (engine.generator, engine.translator, engine.classifier, engine.embedder)  # the defaults first
    return {s.name: s for s in loaded if s is not None} | engine.services


def service_named(engine: Engine, name: str | None, field: str = "model") -> Service:
    by_name = services(engine)
    if name is None:
        if not by_name:
            raise ApiError(503, "unavailable", "no model is loaded")
        return next(iter(by_name.values()))
    if name not in by_name:
        served = ", ".join(repr(n) for n in by_name)
        raise ModelNotLoaded(f"model {name!r} is not served here; served: {served}", field)  # as the engine's
    return by_name[name]
