import asyncio

import pytest

from service.app import begin_drain, inflight
from service.engine.engine import Engine


async def test_ready_only_after_warm_up(serving, monkeypatch: pytest.MonkeyPatch) -> None:
    release = asyncio.Event()
    warmed = []
    original = Engine.warmup

    async def held_warmup(self: Engine) -> None:
        await release.wait()
        await original(self)
        warmed.append(True)

    monkeypatch.setattr(Engine, "warmup", held_warmup)
    async with serving(wait_ready=False, warmup=True) as s:
        assert (await s.client.get("/health")).status_code == 200
        r = await s.client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "warming_up"
        release.set()
        for _ in range(200):
            if (await s.client.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert (await s.client.get("/ready")).json() == {"status": "ready"}
        assert warmed


async def test_failed_warm_up_is_not_ready_nor_healthy(serving, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: Engine) -> None:
        raise RuntimeError("no luck")

    monkeypatch.setattr(Engine, "warmup", broken)
    async with serving(wait_ready=False, warmup=True) as s:
        await asyncio.sleep(0.05)
        assert (await s.client.get("/ready")).status_code == 503
        r = await s.client.get("/health")
        assert r.status_code == 503 and "no luck" in r.json()["detail"]


async def test_draining_refuses_new_work_and_lets_in_flight_finish(serving, slow_down) -> None:
    async with serving() as s:
        gate = slow_down(s.engine.generator.model.session)
        gate.clear()  # the model holds the request in flight until the checks are done
        running = asyncio.ensure_future(
            s.client.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 20, "ignore_eos": True})
        )
        admitted = s.engine.metrics.registry.get_sample_value
        while admitted("serve_queue_time_seconds_count", {"model": "generator"}) != 1:
            await asyncio.sleep(0.01)
        assert inflight(s.app) == 1
        begin_drain(s.app)
        r = await s.client.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "draining"
        refused = await s.client.post("/v1/classify", json={"text": "hi"})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "unavailable"
        assert "retry-after" in refused.headers
        gate.set()
        assert (await running).status_code == 200  # the in-flight request finished normally
        assert inflight(s.app) == 0
        assert (await s.client.get("/health")).status_code == 200
