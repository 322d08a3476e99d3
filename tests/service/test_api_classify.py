import numpy as np


async def test_classify_text_list_and_pairs(served) -> None:
    r = await served.client.post("/v1/classify", json={"text": "What a wonderful film"})
    assert r.status_code == 200
    (result,) = r.json()["results"]
    assert result["label"] in ("negative", "positive")
    assert set(result["scores"]) == {"negative", "positive"}
    assert abs(sum(result["scores"].values()) - 1) < 1e-6
    assert result["score"] == max(result["scores"].values())
    r = await served.client.post(
        "/v1/classify", json={"text": ["good", ["a premise", "a hypothesis"], "bad"], "top_k": 2}
    )
    results = r.json()["results"]
    assert len(results) == 3
    assert results[0]["top_k"][0]["label"] == results[0]["label"]
    assert results[1]["input_tokens"] > results[0]["input_tokens"]


async def test_batch_matches_singles(served) -> None:
    texts = ["good", "a much longer text that needs more tokens than the others", "bad"]
    batch = (await served.client.post("/v1/classify", json={"text": texts})).json()["results"]
    for text, res in zip(texts, batch, strict=True):
        single = (await served.client.post("/v1/classify", json={"text": text})).json()["results"][0]
        np.testing.assert_allclose(list(res["scores"].values()), list(single["scores"].values()), atol=1e-5)


async def test_attention(served) -> None:
    r = await served.client.post("/v1/classify", json={"text": [["a b", "c"]], "return_attention": True})
    result = r.json()["results"][0]
    layers = np.array(result["attention"]["layers"])
    n = result["input_tokens"]
    assert layers.shape == (2, 2, n, n) and result["attention"]["tokens"][0] == "[CLS]"


BAD_CLASSIFY = [
    ({"text": ""}, "text"),
    ({"text": [["only one"]]}, "text[0]"),
    ({"text": [["a", "b", "c"]]}, "text[0]"),
    ({"text": ["fine", " "]}, "text[1]"),
    ({"text": "hi", "top_k": 0}, "top_k"),
    ({"text": "hi", "top_k": 3}, "top_k"),
    ({"text": "word " * 300}, "text"),
    ({"txt": "hi"}, "text"),
]


async def test_bad_input(served) -> None:
    for body, field in BAD_CLASSIFY:
        r = await served.client.post("/v1/classify", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"]["field"] == field, body


async def test_truncate_cuts_a_long_text_from_the_side_asked(served) -> None:
    text = "good film " * 200 + "bad story " * 200
    refused = await served.client.post("/v1/classify", json={"text": ["fine", text]})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "text[1]"
    assert "truncat" in refused.json()["error"]["message"]
    limit = served.engine.classifier.max_tokens
    results = {}
    for side in ("right", "left"):
        body = {"text": ["fine", text, ["a premise", text]], "truncate": True, "truncation_direction": side}
        r = await served.client.post("/v1/classify", json=body)
        assert r.status_code == 200, r.text
        short, long, pair = r.json()["results"]
        assert long["input_tokens"] == pair["input_tokens"] == limit and short["input_tokens"] < limit
        results[side] = long["scores"]
    assert results["right"] != results["left"]  # each end of the text holds other words
    bad = await served.client.post("/v1/classify", json={"text": "hi", "truncation_direction": "middle"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "truncation_direction"


async def test_logits_are_the_raw_scores(served) -> None:
    (result,) = (await served.client.post("/v1/classify", json={"text": "What a film"})).json()["results"]
    logits = np.array(result["logits"])
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(softmax, list(result["scores"].values()), atol=1e-6)
