"""The `Allow` header of a 405: every method that some route serves at the path. Starlette names only the
methods of the first route whose path matches, and two routers serve `/` (GET: the playground redirect,
POST: the Inference API), so it said `Allow: POST` for a path that also answers GET."""

from __future__ import annotations

import re
from functools import lru_cache

from fastapi.routing import iter_route_contexts
from starlette.requests import Request
from starlette.routing import compile_path


@lru_cache(maxsize=256)
def _pattern(path_format: str) -> re.Pattern[str]:
    return compile_path(path_format)[0]


def allowed_methods(request: Request) -> str:
    path, root = request.scope["path"], request.scope.get("root_path", "")
    if root and path.startswith(root):  # behind a proxy's prefix, routes match what follows it
        path = path[len(root) :]
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        if route.methods and route.path and _pattern(route.path).match(path):
            methods |= route.methods
    return ", ".join(sorted(methods))
