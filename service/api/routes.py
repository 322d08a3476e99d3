"""The app's routes, each module's router added route by route to the app's own router.

FastAPI's `include_router` keeps each included router behind a matcher of its own, which for every request
tries the routers in order, each matching its routes twice (to choose, then to handle) while it saves and
restores its scope keys: ~10-20 us of a classify request's ~95 us of Python in the app (measured in
process, the engine stubbed). Added one by one with `add_api_route`, with the same arguments and the
responses merged as `include_router` merges them, the routes and the OpenAPI document are the same and a
request matches each route once.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute


def add_routes(app: FastAPI, router: APIRouter, responses: dict[int | str, dict[str, Any]] | None = None) -> None:
    """Every route of `router` on the app's router; `responses`: documented for each (the route's own win)."""
    for route in router.routes:
        assert isinstance(route, APIRoute), f"not an API route: {route}"  # mounts and websockets: include_router
        app.router.add_api_route(
            route.path,
            route.endpoint,
            response_model=route.response_model,
            status_code=route.status_code,
            tags=route.tags,
            dependencies=route.dependencies,
            summary=route.summary,
            description=route.description,
            response_description=route.response_description,
            responses={**(responses or {}), **route.responses},
            deprecated=route.deprecated,
            methods=route.methods,
            operation_id=route.operation_id,
            response_model_include=route.response_model_include,
            response_model_exclude=route.response_model_exclude,
            response_model_by_alias=route.response_model_by_alias,
            response_model_exclude_unset=route.response_model_exclude_unset,
            response_model_exclude_defaults=route.response_model_exclude_defaults,
            response_model_exclude_none=route.response_model_exclude_none,
            include_in_schema=route.include_in_schema,
            response_class=route.response_class,
            name=route.name,
            route_class_override=type(route),
            callbacks=route.callbacks,
            openapi_extra=route.openapi_extra,
            generate_unique_id_function=route.generate_unique_id_function,
            strict_content_type=route.strict_content_type,
            max_body_size=route.max_body_size,
        )
