"""Adding a task takes four things: its kind in contract/kinds.py, its folder under service/engine/tasks/
(its service, job and registry record), its route module, and its name in the registry's REGISTERED. This
test adds a stub task ("echo": an encoder that answers each text's token count and vector norm) in those
four ways alone, and the whole server serves it: its route, /v1/models, the tokenizer routes, the OpenAPI
document and the Inference API routes (a clear refusal: the stub has no Inference API form)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from fastapi import APIRouter
from pydantic import BaseModel

from contract import kinds
from service.api.deps import EngineDep
from service.engine import registry
from service.engine.registry import TaskRecord
from service.engine.tasks.embedding.service import EmbeddingJob, EmbeddingService

STUB = "echo"
ROUTE_MODULE = "tests_stub_task_routes"


# 1. The contract's kind: an encoder task whose graph is an embedder's.
STUB_TASK = dataclasses.replace(kinds.EMBEDDING, name=STUB, pipeline_tag="token-classification")


# 2. The task's folder: its job, its service and its record.
class EchoJob(EmbeddingJob):
    task: ClassVar[str] = STUB


class EchoService(EmbeddingService):
    task: ClassVar[str] = STUB


RECORD = TaskRecord(
    STUB_TASK,
    build=lambda a, s, settings, metrics: EchoService(a, s["encoder"], settings, metrics),
    route_module=ROUTE_MODULE,
    routes=("/v1/echo",),
    summary="echo (a stub task): `/v1/echo`",
    request_bodies=("EchoRequest",),
)


# 3. Its route module.
class EchoRequest(BaseModel):
    text: str
    model: str | None = None


router = APIRouter(tags=["echo"])


@router.post("/v1/echo")
async def echo(body: EchoRequest, engine: EngineDep) -> dict[str, object]:
    handle = await engine.submit(EchoJob([body.text], ["text"], normalize=False, model=body.model))
    (result,) = await handle.results()
    return {"tokens": result.input_tokens, "norm": math.sqrt(sum(v * v for v in result.vector))}


@pytest.fixture
def stub_task(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(kinds.TASKS, STUB, STUB_TASK)
    folder = types.ModuleType(f"service.engine.tasks.{STUB}.task")
    folder.__dict__["TASK"] = RECORD
    monkeypatch.setitem(sys.modules, folder.__name__, folder)
    monkeypatch.setitem(sys.modules, ROUTE_MODULE, sys.modules[__name__])
    # 4. The registry line.
    monkeypatch.setattr(registry, "REGISTERED", (*registry.REGISTERED, STUB))
    registry.records.cache_clear()
    yield
    registry.records.cache_clear()


@pytest.fixture
def echo_artifacts(tiny_artifacts: Path, tiny_encoder_artifacts: Path, tmp_path: Path) -> Path:
    """The tiny generator, and the tiny embedder's graph and tokenizer as an artifact of the stub task."""
    shutil.copytree(tiny_artifacts / "generator", tmp_path / "generator")
    folder = tmp_path / STUB
    shutil.copytree(tiny_encoder_artifacts / "embedder", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"name": STUB, "task": STUB}))
    (folder / "golden.json").unlink()  # its records name the embedder's config.json
    return tmp_path


async def test_a_task_added_in_its_four_places_is_served_everywhere(stub_task, echo_artifacts, serving) -> None:
    async with serving(artifacts_dir=echo_artifacts, models=f"generator,{STUB}") as s:
        answer = await s.client.post("/v1/echo", json={"text": "hello there"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["tokens"] > 0 and answer.json()["norm"] > 0

        other = await s.client.post("/v1/echo", json={"text": "hi", "model": "generator"})
        assert other.status_code == 404 and other.json()["error"]["field"] == "model", other.text

        models = {m["id"]: m for m in (await s.client.get("/v1/models")).json()["data"]}
        assert models[STUB]["task"] == STUB and models[STUB]["default"] is True

        tokens = await s.client.post("/tokenize", json={"model": STUB, "prompt": "hello there"})
        assert tokens.status_code == 200 and tokens.json()["count"] > 0, tokens.text

        document = (await s.client.get("/openapi.json")).json()
        assert "/v1/echo" in document["paths"] and RECORD.summary in document["info"]["description"]
        assert document["components"]["schemas"]["EchoRequest"]["properties"]["model"]["anyOf"][0]["enum"] == [STUB]

        hub = await s.client.get(f"/api/models/{STUB}")
        assert hub.json()["pipeline_tag"] == "token-classification", hub.text
        refused = await s.client.post(f"/models/{STUB}", json={"inputs": "hello"})
        assert refused.status_code == 422 and "no Inference API form" in refused.json()["error"]["message"]

        # The tasks already served are untouched: the generator is still the default for TGI's routes.
        generated = await s.client.post("/generate", json={"inputs": "Once", "parameters": {"max_new_tokens": 2}})
        assert generated.status_code == 200, generated.text
