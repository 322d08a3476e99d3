async def test_models(served) -> None:
    r = await served.client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    models = {m["id"]: m for m in body["data"]}
    assert set(models) == {"translator", "generator", "classifier"}
    assert models["translator"]["task"] == "translation" and models["generator"]["architecture"] == "decoder-only"
    assert models["classifier"]["labels"] == ["negative", "positive"]
    for m in models.values():
        assert m["object"] == "model" and m["dims"]["n_heads"] > 0 and m["vocab_size"] > 0
        assert set(m["provider"].values()) == {"CPUExecutionProvider"}
        assert set(m["quantization"].values()) == {"none"}
        assert isinstance(m["metrics"], dict)
    assert set(models["translator"]["provider"]) == {"encoder", "decoder"}


async def test_int8_variant_is_used_when_asked(serving) -> None:
    async with serving(quantization="int8", models="classifier,generator") as s:
        models = {m["id"]: m for m in (await s.client.get("/v1/models")).json()["data"]}
        assert models["classifier"]["quantization"] == {"encoder": "int8"}
        assert (await s.client.post("/v1/classify", json={"text": "hi"})).status_code == 200
        assert (await s.client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 2})).status_code == 200
