"""benchmarks/anchor.py end to end on the tiny artifacts (the tiny embedder among them): our server,
CTranslate2 and HF eager, every row; the Llama-shaped rows on a tiny random Llama built by the script.

ctranslate2 comes with the dev extra (through the bench extra), so this runs in CI rather than being skipped.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.anchor_ct2 import mean_pool
from benchmarks.anchor_engines import ROWS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def anchor(tiny_artifacts_with_encoders: Path,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """One run of the script on the tiny artifacts: (its JSON, its stdout, the folder of its built models)."""
    tmp = tmp_path_factory.mktemp("anchor")
    command = [
        sys.executable, "-m", "benchmarks.anchor", "--artifacts", str(tiny_artifacts_with_encoders),
        "--ours", "as-is",
        "--work", str(tmp / "work"), "--rounds", "2", "--scale", "0.01", "--threads", "1",
        "--prompt-tokens", "6", "--new-tokens", "5", "--target-tokens", "4", "--llama-size", "tiny",
        "--out", str(tmp / "anchor.json"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp / "anchor.json").read_text()), done.stdout, tmp / "work"


def test_anchor_runs_every_engine_on_tiny_models(anchor: tuple[dict[str, Any], str, Path]) -> None:
    result, stdout, _ = anchor

    rows = result["rows"]
    assert set(rows) == {*ROWS, "inter_token_latency_c16"}
    for key in ROWS:
        row = rows[key]
        assert row["ours"] > 0 and row["ct2"] > 0 and row["ours_per_ct2"] > 0, (key, row)
        assert row["engine"] > 0 and row["engine_per_ct2"] > 0, (key, row)  # our engine in process, no HTTP
        if key in ("generator_int8_c16", "llama_c16", "llama_c1"):  # no int8 or Llama HF eager row
            assert row["hf"] is None and row["ours_per_hf"] is None
        else:
            assert row["hf"] > 0 and row["ours_per_hf"] > 0, (key, row)
        assert row["equal_lengths"], (key, row["output_tokens"])  # every engine decoded the same lengths
        assert row["floor"] > row["ours"] and 0 < row["ceiling_per_ct2"] < 1, (key, row)  # the no-work server
    assert rows["generator_c16"]["output_tokens"]["ours"] == rows["generator_c16"]["output_tokens"]["engine"] == [5]
    assert rows["translator_beam4_c16"]["output_tokens"]["ct2"] == [4]
    assert rows["llama_c16"]["output_tokens"]["ours"] == rows["llama_c16"]["output_tokens"]["ct2"] == [5]
    itl = rows["inter_token_latency_c16"]
    assert 0 <= itl["p50"] <= itl["p99"]
    assert len(result["rounds"]) == 2 and result["shapes"]["prompt_tokens"] == 6
    assert result["shapes"]["embed_tokens"] > 2  # the sentence between [CLS] and [SEP]
    # Ratios are taken within each round, then the median: two rounds -> the mean of the two.
    per_round = [r["classifier_c32"]["ours_per_ct2"] for r in result["rounds"]]
    assert abs(rows["classifier_c32"]["ours_per_ct2"] - round(sum(per_round) / 2, 3)) < 1e-3
    assert rows["classifier_c32"]["ours_per_ct2_range"] == [round(min(per_round), 3), round(max(per_round), 3)]
    first = result["rounds"][0]["classifier_c1"]
    assert first["ceiling_per_ct2"] == first["floor"] / (first["ct2"] + first["floor"])
    assert "| ours / CT2 |" in stdout and "| our engine in process / CT2 |" in stdout
    assert "| ceiling over HTTP / CT2 |" in stdout


def test_the_llama_rows_decode_the_same_tokens_as_ctranslate2(anchor: tuple[dict[str, Any], str, Path]) -> None:
    """Same random weights, greedy: ours in process and CTranslate2 agree token for token; the KV cache per
    token counts the key/value heads only."""
    result, stdout, _ = anchor
    llama = result["llama"]
    assert llama["greedy_tokens"]["agree"], llama["greedy_tokens"]
    assert all(llama["greedy_tokens"]["tokens"]["engine"]), "every prompt decoded some tokens"
    assert "4 of 4 prompts agree" in stdout
    c = llama["config"]
    assert c["num_key_value_heads"] < c["num_attention_heads"]  # grouped-query attention
    kv_bytes = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * llama["d_head"] * 4
    assert llama["kv_cache_bytes_per_token"] == kv_bytes
    assert llama["kv_bytes_per_token_every_head"] == llama["kv_cache_bytes_per_token"] * 4


def test_the_floor_server_answers_our_clients_with_the_lengths_asked_for() -> None:
    """The floor's answers pass the anchor's own clients: a stream of one event per token, then `done`;
    an embedding of the served embedder's size per input."""
    from benchmarks.http_floor import FloorServer
    from benchmarks.http_load import Connection
    from benchmarks.server_process import free_port

    async def ask() -> list[tuple[int, bytes, int]]:
        conn = Connection("127.0.0.1", floor.port)
        prompt = {"prompt": [5, 6], "max_new_tokens": 7, "ignore_eos": True}
        answers = [(await conn.post("/v1/generate", prompt | {"stream": stream}))[:3] for stream in (True, False)]
        answers.append((await conn.post("/v1/translate", {"text": "Hi.", "max_new_tokens": 4}))[:3])
        answers.append((await conn.post("/v1/classify", {"text": "Hi."}))[:3])
        answers.append((await conn.post("/v1/embeddings", {"model": "embedder", "input": ["Hi.", "Yo."]}))[:3])
        answers.append((await conn.post("/v1/nothing", {}))[:3])
        conn.close()
        return answers

    with FloorServer(free_port(), 384) as floor:
        streamed, plain, translated, classified, embedded, unknown = asyncio.run(ask())
    assert streamed[0] == 200 and streamed[2] == 7 and streamed[1].count(b"event: done") == 1
    assert json.loads(plain[1])["usage"]["completion_tokens"] == 7
    assert json.loads(translated[1])["translations"][0]["output_tokens"] == 4
    assert classified[0] == 200 and json.loads(classified[1])["results"][0]["label"]
    data = json.loads(embedded[1])["data"]
    assert embedded[0] == 200 and [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 384
    assert unknown[0] == 404


def test_ctranslate2_computes_what_transformers_does(anchor: tuple[dict[str, Any], str, Path]) -> None:
    """The converted models are the HF ones (so both columns measure one model): logits, pooled output, scores."""
    import ctranslate2
    import torch
    import transformers

    work = anchor[2]
    ids = np.random.default_rng(0).integers(5, 200, (2, 7))

    def vocab(kind: str) -> list[str]:
        path = work / kind / "ct2"
        tokens: list[str] = json.loads(next(f for f in path.glob("*vocabulary.json")).read_text())
        return tokens

    gen = vocab("generator")
    ct2 = np.asarray(ctranslate2.Generator(str(work / "generator" / "ct2")).forward_batch(
        [[gen[i] for i in row] for row in ids]))
    hf = transformers.GPT2LMHeadModel.from_pretrained(work / "generator" / "hf").eval()
    with torch.inference_mode():
        np.testing.assert_allclose(ct2, hf(torch.tensor(ids)).logits.numpy(), atol=1e-4)

    encoder = ctranslate2.Encoder(str(work / "classifier" / "ct2"))
    pooled = encoder.forward_batch(ids.tolist(), token_type_ids=np.zeros_like(ids).tolist()).pooler_output
    bert = transformers.BertModel.from_pretrained(work / "classifier" / "hf").eval()
    with torch.inference_mode():
        np.testing.assert_allclose(np.asarray(pooled), bert(torch.tensor(ids)).pooler_output.numpy(), atol=1e-4)

    # The embedder rows: CTranslate2's last_hidden_state, mean-pooled and normalised in numpy, is the
    # sentence-transformers vector of the same BertModel.
    encoder = ctranslate2.Encoder(str(work / "embedder" / "ct2"))
    hidden = encoder.forward_batch(ids.tolist(), token_type_ids=np.zeros_like(ids).tolist()).last_hidden_state
    vectors = mean_pool(np.asarray(hidden), np.ones(ids.shape, np.float32))
    bert = transformers.BertModel.from_pretrained(work / "embedder" / "hf").eval()
    with torch.inference_mode():
        expected = torch.nn.functional.normalize(bert(torch.tensor(ids)).last_hidden_state.mean(1), dim=-1)
    np.testing.assert_allclose(vectors, expected.numpy(), atol=1e-4)

    src, tgt = vocab("translator"), ids[1, :5].tolist()
    scored = ctranslate2.Translator(str(work / "translator" / "ct2")).score_batch(
        [[src[i] for i in ids[0]]], [[src[i] for i in tgt]])[0].log_probs[:5]
    marian = transformers.MarianMTModel.from_pretrained(work / "translator" / "hf").eval()
    start = marian.config.decoder_start_token_id
    with torch.inference_mode():
        logits = marian(input_ids=torch.tensor(ids[:1]), decoder_input_ids=torch.tensor([[start, *tgt]])).logits[0]
    expected = torch.log_softmax(logits[:, :-1], -1)  # the converter drops Marian's pad row (the last)
    np.testing.assert_allclose(scored, expected[torch.arange(5), torch.tensor(tgt)].numpy(), atol=1e-4)
