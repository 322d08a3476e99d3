"""Overload, disconnects and timeouts: 429 with Retry-After, slots freed, 504."""

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from service.api.asgi.worker_slots import WorkerSlots
from service.api.errors import ApiError
from service.api.tokenizer.routes import tokenizer_slots
from tests.service.conftest import Served


async def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        assert loop.time() - start < limit_s, "condition not reached"
        await asyncio.sleep(0.005)
    return loop.time() - start


async def test_queue_full_is_429_for_single_and_batch(serving, slow_down) -> None:
    async with serving(max_batch_size=1, max_queue_size=2) as s:
        gate = slow_down(s.engine.classifier.model.session)
        gate.clear()  # the model is stuck: the first request runs, the second fills the queue, the rest overflow
        scheduler, metric = s.engine.classifier.scheduler, s.engine.metrics.registry.get_sample_value
        first = asyncio.ensure_future(s.client.post("/v1/classify", json={"text": "one"}))
        await wait_until(lambda: metric("serve_batch_size_count", {"model": "classifier", "phase": "prefill"}) == 1)
        second = asyncio.ensure_future(s.client.post("/v1/classify", json={"text": ["two", "two more"]}))
        await wait_until(lambda: scheduler.waiting == 2)  # one item runs (stuck), two wait
        for body in ({"text": "three"}, {"text": ["four", "five"]}):
            r = await s.client.post("/v1/classify", json=body)
            assert r.status_code == 429 and r.json()["error"]["type"] == "queue_full"
            assert int(r.headers["retry-after"]) >= 1
        gate.set()
        assert (await first).status_code == 200 and (await second).status_code == 200


async def test_generation_queue_full(serving, slow_down) -> None:
    async with serving(max_batch_size=1, max_queue_size=1) as s:
        gate = slow_down(s.engine.generator.model.session)
        gate.clear()
        req = {"prompt": "hi", "max_new_tokens": 2}
        scheduler = s.engine.generator.scheduler
        first = asyncio.ensure_future(s.client.post("/v1/generate", json=req))
        admitted = s.engine.metrics.registry.get_sample_value
        await wait_until(
            lambda: admitted("serve_queue_time_seconds_count", {"model": "generator"}) == 1
        )  # stuck in prefill
        second = asyncio.ensure_future(
            s.client.post("/v1/completions", json={"model": "generator", "prompt": "hi", "max_tokens": 2})
        )
        await wait_until(lambda: scheduler.waiting == 1)
        r = await s.client.post("/v1/generate", json={**req, "stream": True})
        assert r.status_code == 429 and "retry-after" in r.headers
        gate.set()
        assert (await first).status_code == 200 and (await second).status_code == 200


async def test_disconnect_frees_the_slot_at_the_next_step(serving, monkeypatch, call_and_hang_up) -> None:
    async with serving(max_batch_size=1, max_new_tokens=64) as s:
        # The test hands out model steps one at a time, so "the next step" is exact.
        session, steps, entered = s.engine.generator.model.session, threading.Semaphore(0), []
        original = session.run

        def stepped(*args, **kwargs):
            entered.append(1)
            assert steps.acquire(timeout=30)
            return original(*args, **kwargs)

        monkeypatch.setattr(session, "run", stepped)
        scheduler = s.engine.generator.scheduler
        for n, stream in enumerate((False, True), start=1):
            body = json.dumps({"prompt": "hi", "max_new_tokens": 64, "ignore_eos": True, "stream": stream}).encode()
            hang_up = asyncio.Event()
            call = asyncio.ensure_future(call_and_hang_up(s.app, "/v1/generate", body, hang_up))
            calls = len(entered)
            steps.release(3)  # prefill and two decode steps; the worker then waits inside the fourth
            await wait_until(lambda: len(entered) == calls + 4 and scheduler.running == 1)  # noqa: B023
            hang_up.set()
            sent = await call  # the handler (or the stream) ends without waiting for the model
            assert sent[0]["status"] == (200 if stream else 499)
            steps.release(1)  # finish the step in progress: the sequence leaves the batch after it
            await wait_until(lambda: scheduler.running == 0)
            assert len(entered) == calls + 4
            cancelled = s.engine.metrics.registry.get_sample_value("serve_cancelled_total", {"model": "generator"})
            assert cancelled == n
        steps.release(100)
        r = await s.client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2})
        assert r.status_code == 200


async def test_timeout_is_504_and_frees_the_slot(serving, slow_down) -> None:
    async with serving(max_batch_size=1, request_timeout_s=0.3, max_new_tokens=64) as s:
        slow_down(s.engine.generator.model.session, 0.02)
        r = await s.client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 64, "ignore_eos": True})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        await wait_until(lambda: s.engine.generator.scheduler.running == 0, limit_s=1.0)
        slow_down(s.engine.translator.model.decoder, 0.02)
        r = await s.client.post("/v1/translate", json={"text": "hi", "num_beams": 1, "max_new_tokens": 30})
        assert r.status_code == 504


# --- what a request can make the server hold ------------------------------------------------------------


def _classifier_maps(s: Served, text: str) -> int:
    """The numbers of the classifier's attention maps of one text (layers x heads x tokens^2)."""
    classifier = s.engine.classifier
    assert classifier is not None
    model, tokens = classifier.model, len(classifier.tokenizer.encode(text).ids)
    return len(model.attention_names) * classifier.artifact.n_heads * tokens**2


async def test_attention_budget_is_shared_by_the_requests_in_flight(serving, slow_down) -> None:
    text = "one two three four five"
    async with serving() as probe:
        values = _classifier_maps(probe, text)
    limit = values + values // 2  # one request fits, two do not
    async with serving(max_attention_values=limit, max_attention_values_in_flight=limit) as s:
        budget = s.app.state.attention_budget
        gate = slow_down(s.engine.classifier.model.session)
        gate.clear()
        body = {"text": text, "return_attention": True}
        first = asyncio.ensure_future(s.client.post("/v1/classify", json=body))
        await wait_until(lambda: budget.held == values)
        r = await s.client.post("/v1/classify", json=body)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        error = r.json()["error"]
        assert error["field"] == "return_attention" and "SERVE_MAX_ATTENTION_VALUES_IN_FLIGHT" in error["message"]
        gate.set()
        assert (await first).status_code == 200
        assert budget.held == 0  # given back once the response was sent
        assert (await s.client.post("/v1/classify", json=body)).status_code == 200


async def test_attention_budget_is_given_back_by_streams_and_refused_requests(serving, slow_down) -> None:
    async with serving(max_batch_size=1, max_queue_size=1) as s:
        budget = s.app.state.attention_budget
        body = {"prompt": "one two", "max_new_tokens": 3, "stream": True, "return_attention": True}
        r = await s.client.post("/v1/generate", json=body)
        assert r.status_code == 200 and "event: done" in r.text and budget.held == 0
        gate = slow_down(s.engine.classifier.model.session)
        gate.clear()  # one request runs (stuck), one waits; the third reserves its maps, then the queue refuses it
        first = asyncio.ensure_future(s.client.post("/v1/classify", json={"text": "one"}))
        await wait_until(lambda: s.engine.classifier.scheduler.running == 1)
        second = asyncio.ensure_future(s.client.post("/v1/classify", json={"text": "two"}))
        await wait_until(lambda: s.engine.classifier.scheduler.waiting == 1)
        r = await s.client.post("/v1/classify", json={"text": "three", "return_attention": True})
        assert r.status_code == 429 and r.json()["error"]["type"] == "queue_full"
        assert budget.held == 0
        gate.set()
        assert (await first).status_code == 200 and (await second).status_code == 200


async def test_tokenizer_routes_have_a_token_limit(serving) -> None:
    async with serving(max_tokenize_tokens=8) as s:
        r = await s.client.post("/tokenize", json={"prompt": "one two three four five six seven eight nine ten"})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["field"] == "prompt" and "SERVE_MAX_TOKENIZE_TOKENS" in error["message"]
        r = await s.client.post("/detokenize", json={"tokens": list(range(9))})
        assert r.status_code == 422 and r.json()["error"]["field"] == "tokens"
        r = await s.client.post("/tokenize", json={"prompt": "one two", "return_token_strs": True})
        assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) == len(r.json()["token_strs"])
        assert (await s.client.post("/detokenize", json={"tokens": r.json()["tokens"]})).json()["prompt"]


def _hold_tokenizer(service: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Timer]:
    """The service's tokenizer swapped for a _HeldTokenizer on a gate, and the timer that opens the gate."""
    gate = threading.Event()
    timer = threading.Timer(3.0, gate.set)  # the work ends by itself: a loop it blocked stays blocked till then
    timer.start()
    monkeypatch.setattr(service, "tokenizer", _HeldTokenizer(service.tokenizer, gate))
    return gate, timer


async def _assert_the_loop_answers_while_held(s: Served, gate: threading.Event, timer: threading.Timer) -> None:
    """With tokenizer work waiting on the gate, /health still answers at once; then the gate opens."""
    await asyncio.sleep(0.1)
    started = time.perf_counter()
    assert (await s.client.get("/health")).status_code == 200
    assert time.perf_counter() - started < 1.0 and not gate.is_set()
    gate.set()
    timer.cancel()


class _HeldTokenizer:
    """A tokenizer whose encoding and decoding wait for `gate` (a long input), wherever they are called."""

    def __init__(self, tokenizer: Any, gate: threading.Event) -> None:
        self._tokenizer, self._gate = tokenizer, gate

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tokenizer, name)
        if name not in ("encode", "encode_batch", "decode", "decode_batch"):
            return value

        def held(*args: Any, **kwargs: Any) -> Any:
            assert self._gate.wait(10)
            return value(*args, **kwargs)

        return held


async def test_tokenizer_work_runs_off_the_event_loop(serving, monkeypatch) -> None:
    async with serving() as s:
        gate, timer = _hold_tokenizer(s.engine.generator, monkeypatch)
        calls = [
            asyncio.ensure_future(s.client.post("/tokenize", json={"prompt": "a long text"})),
            asyncio.ensure_future(s.client.post("/detokenize", json={"tokens": [5, 6, 7]})),
        ]
        await _assert_the_loop_answers_while_held(s, gate, timer)
        assert [(await c).status_code for c in calls] == [200, 200]


# ~22 KB: past the size tokenized in place (INLINE_TOKENIZE_CHARS), and past every model's token limit.
LONG_TEXT = "the quick brown fox jumps over the lazy dog " * 500


@pytest.mark.parametrize(
    ("path", "body", "model", "status", "field"),
    [
        ("/v1/generate", {"prompt": LONG_TEXT}, "generator", 422, "prompt"),
        ("/v1/completions", {"model": "generator", "prompt": LONG_TEXT}, "generator", 422, "prompt"),
        ("/generate", {"inputs": LONG_TEXT}, "generator", 422, "inputs"),
        # TGI's truncate keeps the last tokens: the whole text is tokenized (off the loop) and served.
        ("/generate", {"inputs": LONG_TEXT, "parameters": {"truncate": 8, "max_new_tokens": 2}}, "generator", 200,
         None),
        ("/v1/classify", {"text": LONG_TEXT}, "classifier", 422, "text"),
        ("/models/classifier", {"inputs": ["short", LONG_TEXT]}, "classifier", 422, "inputs[1]"),
        ("/v1/translate", {"text": LONG_TEXT}, "translator", 422, "text"),
    ],
)
async def test_long_inference_inputs_are_tokenized_off_the_event_loop(
    serving, monkeypatch, path: str, body: dict[str, Any], model: str, status: int, field: str | None
) -> None:
    async with serving() as s:
        service = s.engine.services[model]
        gate, timer = _hold_tokenizer(service, monkeypatch)
        call = asyncio.ensure_future(s.client.post(path, json=body))
        await _assert_the_loop_answers_while_held(s, gate, timer)
        r = await call
        assert r.status_code == status, r.text
        if field is not None:
            error = r.json()["error"]
            assert error.get("field", error.get("param")) == field and "tokens; the limit is" in error["message"]
        # One bound for all tokenizer work: the inference routes' long texts wait with /tokenize's.
        assert service.tokenizer_work is tokenizer_slots(s.app)


async def test_short_inference_inputs_are_tokenized_in_place(served, monkeypatch) -> None:
    """The hot path: an ordinary text is tokenized on the event loop, with no thread hand-off."""

    class NoWorkers:
        async def run(self, fn: Any, large: bool = False) -> Any:
            raise AssertionError("a short text went to a worker thread")

    for service in served.engine.services.values():
        monkeypatch.setattr(service, "tokenizer_work", NoWorkers())
    for path, body in (
        ("/v1/classify", {"text": ["A wonderful, moving film.", ["a pair", "of texts"]]}),
        ("/v1/generate", {"prompt": "In the beginning", "max_new_tokens": 2}),
        ("/v1/translate", {"text": "Good morning.", "max_new_tokens": 2}),
    ):
        r = await served.client.post(path, json=body)
        assert r.status_code == 200, r.text


async def test_waiting_tokenizer_work_is_bounded() -> None:
    slots = WorkerSlots(workers=1, max_waiting=1, what="tokenizer work")
    gate = threading.Event()
    running = asyncio.ensure_future(slots.run(lambda: gate.wait(10)))
    waiting = asyncio.ensure_future(slots.run(lambda: 2))
    await wait_until(lambda: slots.running == 1 and slots.waiting == 1)
    with pytest.raises(ApiError) as refused:
        await slots.run(lambda: 3)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "1"
    gate.set()
    assert await running is True and await waiting == 2
    assert slots.running == 0 and slots.waiting == 0
