"""`python -m scripts.import_checkpoint --quantize int8|int4`: the graphs hold MatMulNBits weights (the LM head's
too), the card states the precision and its cost, and the unchanged server serves the artifact beside the fp32
import of the same checkpoint, scoring a prompt close to it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from model.export.int8 import add_int8_variants
from scripts import import_checkpoint as cli
from tests.service.hf_reference import Serving, serving_artifacts

PRECISIONS = {"int4": 4, "int8": 8}
# Of the prompt positions, the share whose most likely next token must be fp32's: a tiny random model's logits
# are nearly flat, so int4 flips some; broken weights would agree at about 1 in the 300-token vocabulary.
AGREEMENT = {"int4": 0.6, "int8": 0.85}
PROMPT = "The movie was wonderful, a delight from start to finish, and the actors were brilliant."


@pytest.fixture(scope="module")
def quantized(hf_decoder_imports: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifacts folder: the fp32 import of the tiny Llama checkpoint, and its int4 and int8 imports."""
    root = tmp_path_factory.mktemp("quantized")
    (root / "llama").symlink_to(hf_decoder_imports / "artifacts" / "llama")
    for precision in PRECISIONS:
        checkpoint = hf_decoder_imports / "checkpoints" / "llama"
        assert cli.main([str(checkpoint), "--out", str(root / f"llama-{precision}"), "--quantize", precision]) == 0
    return root


def weight_matmuls(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """(op, bits) of each matmul whose weights are stored in the graph (MatMul on an initializer or its Cast)."""
    stored = {i.name for i in model.graph.initializer}
    stored |= {n.output[0] for n in model.graph.node if n.op_type == "Cast" and n.input[0] in stored}
    found = []
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            found.append((node.op_type, int(next(helper.get_attribute_value(a) for a in node.attribute
                                                 if a.name == "bits"))))
        elif node.op_type == "MatMul" and node.input[1] in stored:
            found.append((node.op_type, 32))
    return found


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_weight_matmul_is_quantized_and_the_card_says_so(quantized: Path, precision: str) -> None:
    folder = quantized / f"llama-{precision}"
    config = json.loads((folder / "config.json").read_text())
    graph = config["graphs"]["decoder"]
    assert config["export"]["quantization"]["precision"] == precision and graph["int8_file"] is None
    layers = config["dims"]["n_layers"]
    matmuls = weight_matmuls(onnx.load(str(folder / graph["file"])))
    # q, k, v, out, gate, up, down per layer, and the LM head (tied to the embedding: transposed out of it)
    assert matmuls == [("MatMulNBits", PRECISIONS[precision])] * (7 * layers + 1)
    card = json.loads((folder / "card.json").read_text())
    cost = card["quantization"]["cost"]
    assert cost["held_out_perplexity"]["fp32"] > 0 and cost["held_out_perplexity"]["quantized"] > 0
    assert cost["sample_batch"]["top1_agreement_vs_fp32"] >= AGREEMENT[precision]
    card_md = (folder / "card.md").read_text()
    assert f"| precision | {precision} weights (ONNX Runtime MatMulNBits" in card_md
    assert "| quantization cost: perplexity |" in card_md and "held-out passage" in card_md


def test_the_dynamic_int8_pass_leaves_a_quantized_artifact_alone(quantized: Path, tmp_path: Path) -> None:
    """The Dockerfile's int8 stage (model/export/int8.py) adds variants where int8_file is null: not to these."""
    shutil.copytree(quantized / "llama-int4", tmp_path / "llama-int4")
    assert add_int8_variants(tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "llama-int4").glob("*.onnx")) == ["decoder.onnx"]


async def scores(client: Any, model: str) -> dict[str, Any]:
    """The prompt's token logprobs and, at each position, the most likely token, as /v1/completions scores it."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    logprobs = r.json()["choices"][0]["logprobs"]  # the prompt's, then the generated token's
    top = [max(t, key=t.get) if t else None for t in logprobs["top_logprobs"]]
    return {"logprobs": np.array(logprobs["token_logprobs"][1:-1], dtype=float), "top": top[1:-1]}


@pytest.mark.parametrize("precision", PRECISIONS)
async def test_the_server_scores_a_prompt_close_to_fp32(serving: Serving, quantized: Path, precision: str) -> None:
    model = f"llama-{precision}"
    async with serving_artifacts(serving, quantized)(models=f"llama,{model}") as s:
        fp32, ours = await scores(s.client, "llama"), await scores(s.client, model)
    agreement = np.mean([a == b for a, b in zip(fp32["top"], ours["top"], strict=True)])
    assert agreement >= AGREEMENT[precision], (agreement, fp32["top"], ours["top"])
    difference = np.abs(fp32["logprobs"] - ours["logprobs"]).mean()
    assert difference < (0.15 if precision == "int4" else 0.02), difference
