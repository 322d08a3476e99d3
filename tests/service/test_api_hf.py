"""TGI's /generate, /generate_stream and /info; POST / and /models/{name} by the model's task, in the
Hugging Face Inference API's `{"inputs", "parameters"}` shapes."""

import json


def tgi_events(body: bytes) -> list[dict]:
    return [json.loads(line[5:]) for line in body.decode().split("\n") if line.startswith("data:")]


async def test_generate_matches_our_generate(served) -> None:
    params = {"max_new_tokens": 5, "details": True, "decoder_input_details": True, "seed": 3, "do_sample": True}
    r = await served.client.post("/generate", json={"inputs": "Hello", "parameters": params})
    assert r.status_code == 200, r.text
    body = r.json()
    ours = await served.client.post(
        "/v1/generate", json={"prompt": "Hello", "max_new_tokens": 5, "seed": 3, "logprobs": True}
    )
    assert body["generated_text"] == ours.json()["text"]
    details = body["details"]
    assert details["finish_reason"] in ("length", "eos_token", "stop_sequence") and details["seed"] == 3
    assert details["generated_tokens"] == len(details["tokens"]) == ours.json()["usage"]["completion_tokens"]
    assert [t["id"] for t in details["tokens"]] == [t["id"] for t in ours.json()["tokens"]]
    prompt_ids = served.engine.generator.tokenizer.encode("Hello").ids
    assert [t["id"] for t in details["prefill"]] == prompt_ids and details["prefill"][0]["logprob"] is None


async def test_greedy_by_default_and_unknown_parameters_ignored(served) -> None:
    req = {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "some_future_flag": True}}
    a = (await served.client.post("/generate", json=req)).json()["generated_text"]
    b = (await served.client.post("/generate", json=req)).json()["generated_text"]
    greedy = await served.client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 4, "temperature": 0})
    assert a == b == greedy.json()["text"]


async def test_unsupported_parameters_are_422(served) -> None:
    for bad in ({"grammar": {"type": "json", "value": {}}}, {"watermark": True}, {"best_of": 2}, {"top_p": 0}):
        r = await served.client.post("/generate", json={"inputs": "Hello", "parameters": bad})
        assert r.status_code == 422, bad
        assert r.json()["error"]["field"].startswith("parameters.")


async def test_generate_stream(served) -> None:
    req = {"inputs": "Hello", "parameters": {"max_new_tokens": 6, "decoder_input_details": False}}
    r = await served.client.post("/generate_stream", json=req)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = tgi_events(r.content)
    assert events and all(set(e) >= {"index", "token", "generated_text", "details"} for e in events)
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    last = events[-1]
    assert last["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert last["details"]["generated_tokens"] == len(events)
    whole = (await served.client.post("/generate", json=req)).json()["generated_text"]
    assert last["generated_text"] == whole


async def test_root_dispatches_by_task(served) -> None:
    r = await served.client.post("/", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200 and isinstance(r.json(), list) and "generated_text" in r.json()[0]
    stream = await served.client.post("/", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}, "stream": True})
    assert tgi_events(stream.content)[-1]["generated_text"] == r.json()[0]["generated_text"]

    labels = served.engine.classifier.artifact.labels
    c = await served.client.post("/models/classifier", json={"inputs": "What a film"})
    assert c.status_code == 200
    (ranked,) = c.json()
    assert sorted(x["label"] for x in ranked) == sorted(labels)
    assert [x["score"] for x in ranked] == sorted((x["score"] for x in ranked), reverse=True)
    ours = (await served.client.post("/v1/classify", json={"text": "What a film"})).json()["results"][0]
    assert ranked[0] == {"label": ours["label"], "score": ours["score"]}
    top1 = await served.client.post("/models/classifier", json={"inputs": ["a", "b"], "parameters": {"top_k": 1}})
    assert [len(x) for x in top1.json()] == [1, 1]
    pair = await served.client.post("/models/classifier", json={"inputs": {"text": "a", "text_pair": "b"}})
    assert pair.status_code == 200

    t = await served.client.post("/models/translator", json={"inputs": "Hello", "parameters": {"src_lang": "en"}})
    ours_t = await served.client.post("/v1/translate", json={"text": "Hello"})
    assert t.json() == [{"translation_text": ours_t.json()["translations"][0]["text"]}]
    wrong_lang = await served.client.post("/models/translator", json={"inputs": "Hi", "parameters": {"tgt_lang": "de"}})
    assert wrong_lang.status_code == 422 and wrong_lang.json()["error"]["field"] == "parameters.tgt_lang"

    missing = await served.client.post("/models/nope", json={"inputs": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "name"
    bad = await served.client.post("/models/classifier", json={"inputs": ""})
    assert bad.status_code == 422 and bad.json()["error"]["field"].startswith("inputs")


async def test_info_and_health(served) -> None:
    info = (await served.client.get("/info")).json()
    assert info["model_id"] == "generator" and info["model_pipeline_tag"] == "text-generation"
    assert info["max_total_tokens"] == served.engine.generator.artifact.max_positions
    classifier = (await served.client.get("/models/classifier/info")).json()
    assert classifier["model_pipeline_tag"] == "text-classification"
    assert (await served.client.get("/models/translator/health")).status_code == 200
    assert (await served.client.get("/models/nope/info")).status_code == 404
