from pathlib import Path

import pytest


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


async def test_summary_says_what_each_model_is_for(serving, tiny_artifacts, tmp_path) -> None:
    """`summary` is one line from the card's intended_use and domains, on the list and on each model, with
    SERVE_MODEL_DETAILS=false too; a card that states none (the untrained tiny models) says so."""
    import json
    import shutil

    from contract.cards import no_use_summary

    folder = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, folder)
    stated = {"translator": ("English -> French translation", ["Bible verses", "UI strings"]),
              "generator": ("continuing speeches\n in the style of the State of the Union.",
                            ["State of the Union addresses"])}
    for name, (use, domains) in stated.items():
        path = folder / name / "card.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"intended_use": use, "domains": domains}))
    expected = {"translator": "English -> French translation; trained on Bible verses and UI strings.",
                "generator": "continuing speeches in the style of the State of the Union; trained on State of "
                             "the Union addresses.",
                "classifier": no_use_summary("classification")}
    for details in (False, True):
        async with serving(artifacts_dir=folder, model_details=details) as s:
            listed = {m["id"]: m for m in (await s.client.get("/v1/models")).json()["data"]}
            assert {name: m["summary"] for name, m in listed.items()} == expected
            for name, summary in expected.items():
                one = (await s.client.get(f"/v1/models/{name}")).json()
                assert one["summary"] == summary and ("card" in one) == details
            schema = (await s.client.get("/openapi.json")).json()["components"]["schemas"]["ModelCard"]
            assert "summary" in schema["required"] and "intended_use" in schema["properties"]["summary"]["description"]


def test_summary_without_a_stated_use_takes_the_right_article() -> None:
    from contract.cards import no_use_summary

    assert no_use_summary("embedding").startswith("an embedding model; ")
    assert no_use_summary("classification").startswith("a classification model; ")
    assert no_use_summary("generation").startswith("a generation model; ")


REAL = Path(__file__).resolve().parents[2] / "artifacts"
REAL_MODELS = ("translator", "generator", "classifier", "classifier-minilm")


@pytest.mark.skipif(not all((REAL / n / "config.json").is_file() for n in REAL_MODELS),
                    reason="artifacts/ is incomplete")
async def test_real_models_summary_states_use_and_domains(serving) -> None:
    """Every trained model's card states its intended use and domains, and /v1/models says them in one line."""
    import json

    from contract.cards import use_summary

    async with serving(artifacts_dir=REAL, models=",".join(REAL_MODELS), model_details=False) as s:
        listed = {m["id"]: m for m in (await s.client.get("/v1/models")).json()["data"]}
    assert set(listed) == set(REAL_MODELS)
    for name, model in listed.items():
        card = json.loads((REAL / name / "card.json").read_text())
        assert card["intended_use"] and card["domains"] and card["out_of_scope"], name
        assert model["summary"] == use_summary(card) and "\n" not in model["summary"], name
        assert all(domain in model["summary"] for domain in card["domains"]), name
        examples = card["out_of_domain_examples"]
        assert len(examples) >= 2 and all(e["input"] and e["output"] and e["note"] for e in examples), name
        assert "scripts.card_examples" in card["out_of_domain_examples_how"], name
    assert "French" in listed["translator"]["summary"] and "Bible" in listed["translator"]["summary"]
    assert "State of the Union" in listed["generator"]["summary"]
    assert all("movie-review" in listed[n]["summary"] for n in ("classifier", "classifier-minilm"))
