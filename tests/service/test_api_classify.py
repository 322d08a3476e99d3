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
