"""SSE rendering without pydantic round trips or a JSON encoder per event: the same bytes as before."""

import json
import math
from typing import Any

from service.api.native.generate import _event, token_data, token_model
from service.api.sse import sse
from service.engine.tasks.generation.decoding import TokenEvent, TopLogprob

TEXTS = [
    "plain",
    "",
    " é “quoted” ☃ 😀",
    'quote " backslash \\ tab \t newline \n nul \x00 del \x7f',
    "\u2028\u2029",
]


def reference(data: Any, event: str | None = None) -> str:
    """sse() as it was: json.dumps with these options on every call."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def token_events() -> list[TokenEvent]:
    top = [TopLogprob(7, "a\nb", -0.25), TopLogprob(8, "ü", -1.2e-05), TopLogprob(9, "x", -math.inf)]
    out = []
    for i, text in enumerate(TEXTS):
        out += [
            TokenEvent(i, 100 + i, text, special=i % 2 == 0),
            TokenEvent(i, 3, text, False, logprob=-0.123456789),
            TokenEvent(i, 3, text, True, logprob=-1e-07, top_logprobs=top),
            TokenEvent(i, 3, text, False, logprob=0.0, top_logprobs=[]),  # asked with k=0: no list
        ]
    return out


def test_token_events_render_as_the_models_did() -> None:
    for event in token_events():
        assert token_data(event) == token_model(event).model_dump(exclude_none=True)
        data = {"type": "token", "index": event.index, **token_model(event).model_dump(exclude_none=True)}
        assert _event(event) == reference(data, "token")


def test_sse_json_is_json_dumps() -> None:
    cases: list[Any] = [
        {"a": 1.0, "b": [1e-05, 1e16, -0.0, math.nan, math.inf, -math.inf], "c": None, "d": True, "e": False},
        {"nested": {"x": [{"y": []}, {}]}, 1: "int key", 2.5: "float key", None: "null key"},
        {True: "bool key"},  # a dict of its own: beside 1 it would be the same key
        {"text": "".join(TEXTS), "big": 2**63 - 1, "neg": -(2**70)},
        [],
        3,
        "[DONE]",
    ]
    for data in cases:
        assert sse(data) == reference(data) and sse(data, "done") == reference(data, "done")
