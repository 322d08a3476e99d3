import numpy as np

from tests.service.sse_events import events


async def test_translate_one_and_many(served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "Hello world", "max_new_tokens": 5})
    assert r.status_code == 200
    (t,) = r.json()["translations"]
    assert set(t) == {"text", "score", "input_tokens", "output_tokens"} and 1 <= t["output_tokens"] <= 5
    r = await served.client.post(
        "/v1/translate", json={"text": ["Hello", "A dull story."], "num_beams": 3, "n_best": 2, "max_new_tokens": 5}
    )
    translations = r.json()["translations"]
    assert len(translations) == 2
    for t in translations:
        assert len(t["n_best"]) == 2 and t["n_best"][0]["text"] == t["text"]
        assert t["n_best"][0]["score"] >= t["n_best"][1]["score"]


async def test_greedy_sampling_is_seeded(served) -> None:
    req = {"text": "Hello world", "num_beams": 1, "do_sample": True, "seed": 3, "max_new_tokens": 6}
    a = await served.client.post("/v1/translate", json=req)
    b = await served.client.post("/v1/translate", json=req)
    assert a.json() == b.json()


async def test_greedy_takes_stop_strings_and_a_repetition_penalty(served) -> None:
    plain = {"text": "A dull story about the roads.", "num_beams": 1, "max_new_tokens": 16, "do_sample": True,
             "seed": 1}
    text = (await served.client.post("/v1/translate", json=plain)).json()["translations"][0]["text"]
    stop = text.strip()[len(text.strip()) // 2 :][:2]  # two characters from the middle of the output
    assert stop.strip(), text
    cut = (await served.client.post("/v1/translate", json={**plain, "stop": [stop]})).json()["translations"][0]
    assert cut["text"] == text[: text.index(stop)]
    greedy = {**plain, "do_sample": False, "repetition_penalty": 10.0}
    assert (await served.client.post("/v1/translate", json=greedy)).status_code == 200


async def test_attention_maps(served) -> None:
    r = await served.client.post(
        "/v1/translate", json={"text": "Hello world", "max_new_tokens": 4, "num_beams": 2, "return_attention": True}
    )
    t = r.json()["translations"][0]
    att = t["attention"]
    S, T = t["input_tokens"], t["output_tokens"]
    assert len(att["source_tokens"]) == S and len(att["target_tokens"]) == T
    assert np.array(att["encoder"]).shape == (2, 2, S, S)
    assert np.array(att["decoder"]).shape == (2, 2, T, T)
    cross = np.array(att["cross"])
    assert cross.shape == (2, 2, T, S)
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-3)


BAD_TRANSLATE = [
    ({"text": ""}, 422, "text"),
    ({"text": ["ok", "  "]}, 422, "text[1]"),
    ({"text": []}, 422, "text"),
    ({"text": "hi", "n_best": 5, "num_beams": 2}, 422, None),
    ({"text": "hi", "num_beams": 0}, 422, "num_beams"),
    ({"text": "hi", "do_sample": True, "num_beams": 2}, 422, "do_sample"),
    ({"text": "hi", "max_new_tokens": 1000}, 422, "max_new_tokens"),
    ({"text": "word " * 200}, 422, "text"),
    ({"text": 5}, 422, "text"),
    ({"text": "hi", "beams": 2}, 422, "beams"),
    ({"text": "hi", "stream": True, "num_beams": 2}, 422, "stream"),
    ({"text": ["hi", "ho"], "stream": True, "num_beams": 1}, 422, "text"),
    ({"text": "hi", "repetition_penalty": 1.3}, 422, "repetition_penalty"),  # the default: 4 beams
    ({"text": "hi", "stop": ["."]}, 422, "stop"),
    ({"text": "hi", "num_beams": 1, "stop": ""}, 422, "stop"),
    ({"text": "hi", "num_beams": 1, "repetition_penalty": 0}, 422, "repetition_penalty"),
]


async def test_bad_input(served) -> None:
    for body, status, field in BAD_TRANSLATE:
        r = await served.client.post("/v1/translate", json=body)
        assert r.status_code == status, (body, r.text)
        if field:
            assert r.json()["error"]["field"] == field, body


async def test_num_beams_beyond_batch_rows(serving) -> None:
    async with serving(max_batch_size=2) as s:
        r = await s.client.post("/v1/translate", json={"text": "hi", "num_beams": 3})
        assert r.status_code == 422 and r.json()["error"]["field"] == "num_beams"


async def test_stream_matches_the_whole_translation(served) -> None:
    req = {"text": "In the beginning God created the heavens.", "num_beams": 1, "max_new_tokens": 9}
    whole = (await served.client.post("/v1/translate", json=req)).json()["translations"][0]
    r = await served.client.post("/v1/translate", json={**req, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    parsed = events(r.content)
    tokens, (last_name, done) = parsed[:-1], parsed[-1]
    assert [name for name, _ in tokens] == ["token"] * whole["output_tokens"] and last_name == "done"
    assert [d["index"] for _, d in tokens] == list(range(whole["output_tokens"]))
    assert done["translation"] == whole
    assert "".join(d["text"] for _, d in tokens) == whole["text"]


async def test_stream_of_a_sampled_translation_is_seeded(served) -> None:
    req = {"text": "Hello world", "num_beams": 1, "do_sample": True, "seed": 5, "max_new_tokens": 6}
    whole = (await served.client.post("/v1/translate", json=req)).json()["translations"][0]
    streamed = events((await served.client.post("/v1/translate", json={**req, "stream": True})).content)
    assert streamed[-1][1]["translation"] == whole
