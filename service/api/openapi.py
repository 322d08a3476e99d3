"""The OpenAPI document with the limits that depend on the loaded models (known only after start-up)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


def _integer_member(prop: dict[str, Any]) -> dict[str, Any]:
    """The integer schema of a property (`int` or `int | None`)."""
    return next((m for m in prop.get("anyOf", []) if m.get("type") == "integer"), prop)


def add_model_limits(schema: dict[str, Any], app: FastAPI) -> None:
    engine = getattr(app.state, "engine", None)
    components = schema.get("components", {}).get("schemas", {})
    if engine is not None and engine.generator is not None and "CompletionRequest" in components:
        components["CompletionRequest"]["properties"]["model"]["enum"] = engine.model_names("generation")
    if engine is not None and engine.classifier is not None and "ClassifyRequest" in components:
        top_k = components["ClassifyRequest"]["properties"]["top_k"]
        _integer_member(top_k)["maximum"] = len(engine.classifier.labels)


def install_openapi(app: FastAPI) -> None:
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            add_model_limits(build(), app)  # build() caches its result in app.openapi_schema
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
