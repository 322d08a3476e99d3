"""JSON numbers as JSON Schema reads them: `1.0` is an integer (a number with no fractional part), so a
request that the OpenAPI document calls valid is one the server takes. Pydantic's strict mode would
refuse `1.0` for an `int` field; its lax mode would also take `"1"`, which the document calls invalid.
So the request models keep strict mode and integral floats are turned into ints before validation."""

from __future__ import annotations

from typing import Any

# The request bodies hold integers at most 4 levels down (completions' prompt: [[token id, ...], ...]
# under the body; the Inference API's parameters.generate_parameters.num_beams): deeper input is left as
# it is (and refused by the schema), and no recursion follows a hostile nesting depth.
MAX_DEPTH = 4


def integral_floats_as_ints(value: Any, depth: int = MAX_DEPTH) -> Any:
    """`value` with every float that has no fractional part (1.0, -0.0, 1e3) made an int, in dicts and
    lists down to `depth` levels. Infinity and NaN have none and stay floats."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if depth == 0:
        return value
    if type(value) is dict:
        if _CONTAINERS.isdisjoint(map(type, value.values())):  # at C speed: most bodies hold no float
            return value
        return {k: integral_floats_as_ints(v, depth - 1) for k, v in value.items()}
    if type(value) is list:
        if _CONTAINERS.isdisjoint(map(type, value)):  # a list of token ids or texts: returned as it is
            return value
        return [integral_floats_as_ints(v, depth - 1) for v in value]
    return value


_CONTAINERS = frozenset({float, dict, list})
