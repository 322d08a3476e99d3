"""Overload, disconnects and timeouts: 429 with Retry-After, slots freed, 504."""

import asyncio
import json
import threading


async def wait_until(predicate, timeout: float = 5.0) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        assert loop.time() - start < timeout, "condition not reached"
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
        await wait_until(lambda: s.engine.generator.scheduler.running == 0, timeout=1.0)
        slow_down(s.engine.translator.model.decoder, 0.02)
        r = await s.client.post("/v1/translate", json={"text": "hi", "num_beams": 1, "max_new_tokens": 30})
        assert r.status_code == 504
