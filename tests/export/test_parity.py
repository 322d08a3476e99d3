"""PyTorch vs ONNX Runtime on freshly exported tiny models: parity, caching, and the shape grid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")  # the training extra; .ci/run installs it
import onnxruntime as ort
import torch

from model.export.graphs import round_weights_to_fp16
from model.export.tiny import build_tiny_model
from model.network.layers import positions_from_mask
from model.network.translator import Translator

ATOL = 1e-4
DECODE_STEPS = 20


class Exported:
    """A tiny exported model: its PyTorch reference, config.json and ORT sessions for each graph."""

    def __init__(self, model: torch.nn.Module, folder: Path) -> None:
        self.model, self.dir = model.eval(), folder
        self.config = json.loads((folder / "config.json").read_text())
        self.sessions = {role: ort.InferenceSession(str(folder / g["file"]), providers=["CPUExecutionProvider"])
                         for role, g in self.config["graphs"].items()}

    def run(self, role: str, feeds: dict[str, np.ndarray], int8: bool = False) -> dict[str, np.ndarray]:
        session = self.sessions[role]
        if int8:
            session = ort.InferenceSession(str(self.dir / self.config["graphs"][role]["int8_file"]),
                                           providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=False))


@pytest.fixture(scope="module")
def tiny(tiny_artifacts: Path) -> dict[str, Exported]:
    """The tiny exported artifacts next to their PyTorch references (rebuilt deterministically)."""
    exported = {}
    for kind in ("translator", "generator", "classifier"):
        model, _ = build_tiny_model(kind)
        round_weights_to_fp16(model)
        exported[kind] = Exported(model, tiny_artifacts / kind)
    return exported


@pytest.fixture(params=["translator", "generator", "classifier"])
def exported(request: pytest.FixtureRequest, tiny: dict[str, Exported]) -> Exported:
    return tiny[request.param]


def kv_feeds(prefix: str, tensors: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{prefix}.{i // 2}.{'key' if i % 2 == 0 else 'value'}": t for i, t in enumerate(tensors)}


def presents(outputs: dict[str, np.ndarray], n_layers: int) -> list[np.ndarray]:
    return [outputs[f"present.{i}.{kv}"] for i in range(n_layers) for kv in ("key", "value")]


def left_padded_prompts(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = [7, 3, 5]
    ids = np.zeros((3, 7), dtype=np.int64)
    mask = np.zeros((3, 7), dtype=np.int64)
    for row, n in enumerate(lengths):
        ids[row, 7 - n :] = rng.integers(4, vocab, n)
        mask[row, 7 - n :] = 1
    return ids, mask


def test_generator_parity_prefill_and_decode(tiny: dict[str, Exported]) -> None:
    exported = tiny["generator"]
    model, L = exported.model.eval(), exported.config["dims"]["n_layers"]
    H, Dh = exported.config["dims"]["n_heads"], exported.config["dims"]["d_head"]
    ids, mask = left_padded_prompts(exported.config["vocab_size"])
    empty = [np.zeros((3, H, 0, Dh), dtype=np.float32)] * (2 * L)
    tokens, past, ort_tokens, torch_tokens, torch_past = ids, empty, [], [], None
    torch_ids = torch.from_numpy(ids)
    for step in range(DECODE_STEPS + 1):
        positions = positions_from_mask(torch.from_numpy(mask), tokens.shape[1]).numpy()
        out = exported.run("decoder", {"input_ids": tokens, "attention_mask": mask, "position_ids": positions,
                                       **kv_feeds("past_key_values", past)})
        with torch.no_grad():
            ref_logits, torch_past, _ = model(torch_ids, torch.from_numpy(mask), torch.from_numpy(positions),
                                              torch_past)
        real = mask[:, -tokens.shape[1] :].astype(bool)  # compare real positions only
        assert np.abs(out["logits"][real] - ref_logits.numpy()[real]).max() <= ATOL, f"step {step}"
        next_ort = out["logits"][:, -1].argmax(-1)
        next_torch = ref_logits[:, -1].argmax(-1)
        ort_tokens.append(next_ort)
        torch_tokens.append(next_torch.numpy())
        tokens, torch_ids = next_ort[:, None].astype(np.int64), next_torch[:, None]
        past = presents(out, L)
        mask = np.concatenate([mask, np.ones((3, 1), dtype=np.int64)], axis=1)
    assert np.array_equal(np.stack(ort_tokens), np.stack(torch_tokens))

    # Cached vs uncached in ORT: recompute the whole sequence with an empty past, same tokens.
    full_ids = np.concatenate([ids, np.stack(ort_tokens[:-1], axis=1)], axis=1)
    full_mask = mask[:, :-1]
    full_positions = positions_from_mask(torch.from_numpy(full_mask), full_ids.shape[1]).numpy()
    out = exported.run("decoder", {"input_ids": full_ids, "attention_mask": full_mask, "position_ids": full_positions,
                                   **kv_feeds("past_key_values", empty)})
    recomputed = out["logits"][:, ids.shape[1] - 1 :].argmax(-1)
    assert np.array_equal(recomputed.T, np.stack(ort_tokens))


def test_generator_logits_to_keep(tiny: dict[str, Exported]) -> None:
    """logits_to_keep = k returns the logits of the last k new positions (0 or k > S: all of them), equal
    to PyTorch's, with and without a past; the caches do not depend on it."""
    exported = tiny["generator"]
    graph = exported.config["graphs"]["decoder"]
    assert {"name": "logits_to_keep", "dtype": "int64", "shape": [], "default": 0} in graph["inputs"]
    model, L = exported.model.eval(), exported.config["dims"]["n_layers"]
    ids, mask = left_padded_prompts(exported.config["vocab_size"])
    positions = positions_from_mask(torch.from_numpy(mask), ids.shape[1]).numpy()
    dims = exported.config["dims"]
    empty = [np.zeros((3, dims["n_heads"], 0, dims["d_head"]), np.float32)] * (2 * L)
    prompt = {"input_ids": ids[:, :-2], "attention_mask": mask[:, :-2], "position_ids": positions[:, :-2],
              **kv_feeds("past_key_values", empty)}
    past = presents(exported.run("decoder", prompt), L)
    cached = {"input_ids": ids[:, -2:], "attention_mask": mask, "position_ids": positions[:, -2:],
              **kv_feeds("past_key_values", past)}
    for feeds in (prompt, cached):
        S = feeds["input_ids"].shape[1]
        full = exported.run("decoder", feeds)
        torch_past = [(torch.from_numpy(feeds[f"past_key_values.{i}.key"]),
                       torch.from_numpy(feeds[f"past_key_values.{i}.value"])) for i in range(L)]
        for keep in (0, 1, 2, S, S + 3):
            out = exported.run("decoder", feeds | {"logits_to_keep": np.array(keep, dtype=np.int64)})
            kept = S if keep == 0 else min(keep, S)
            assert out["logits"].shape == (3, kept, exported.config["vocab_size"]), (S, keep)
            assert np.abs(out["logits"] - full["logits"][:, S - kept :]).max() <= 1e-5, (S, keep)
            assert all(np.array_equal(out[n], full[n]) for n in full if n.startswith("present.")), (S, keep)
            with torch.no_grad():
                inputs = (torch.from_numpy(feeds[n]) for n in ("input_ids", "attention_mask", "position_ids"))
                ref, _, _ = model(*inputs, torch_past, torch.tensor(keep))
            assert ref.shape == out["logits"].shape
            real = feeds["attention_mask"][:, -kept:].astype(bool)
            assert np.abs(out["logits"][real] - ref.numpy()[real]).max() <= ATOL, (S, keep)


def test_translator_parity_encoder_and_decode(tiny: dict[str, Exported]) -> None:
    exported = tiny["translator"]
    model, dims = exported.model.eval(), exported.config["dims"]
    assert isinstance(model, Translator)
    L, H, Dh = dims["n_decoder_layers"], dims["n_heads"], dims["d_head"]
    bos = exported.config["special_tokens"]["bos"]
    rng = np.random.default_rng(1)
    src = rng.integers(4, exported.config["vocab_size"], (3, 6)).astype(np.int64)
    src_mask = np.array([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=np.int64)
    enc = exported.run("encoder", {"input_ids": src, "attention_mask": src_mask})
    with torch.no_grad():
        memory, _ = model.encode(torch.from_numpy(src), torch.from_numpy(src_mask))
        ref_cross = model.cross_kv(memory)
    real = src_mask.astype(bool)  # [B, Ssrc]: compare real source positions only
    for i, pair in enumerate(ref_cross):
        for name, expected in zip(("key", "value"), pair, strict=False):
            got = enc[f"cross.{i}.{name}"].transpose(0, 2, 1, 3)[real]  # [B, H, S, Dh] -> [real, H, Dh]
            assert np.abs(got - expected.numpy().transpose(0, 2, 1, 3)[real]).max() <= ATOL
    cross = [enc[f"cross.{i}.{kv}"] for i in range(L) for kv in ("key", "value")]
    past = [np.zeros((3, H, 0, Dh), dtype=np.float32)] * (2 * L)
    tokens = np.full((3, 1), bos, dtype=np.int64)
    torch_tokens, torch_past, ort_seq, torch_seq = torch.from_numpy(tokens), None, [], []
    for step in range(DECODE_STEPS + 1):
        mask = np.ones((3, step + 1), dtype=np.int64)
        positions = np.full((3, 1), step, dtype=np.int64)
        out = exported.run("decoder", {"input_ids": tokens, "attention_mask": mask, "position_ids": positions,
                                       "encoder_attention_mask": src_mask, **kv_feeds("cross", cross),
                                       **kv_feeds("past_key_values", past)})
        with torch.no_grad():
            ref, torch_past, _, _ = model.decode(torch_tokens, torch.from_numpy(mask), torch.from_numpy(positions),
                                                 torch.from_numpy(src_mask), ref_cross, torch_past)
        assert np.abs(out["logits"] - ref.numpy()).max() <= ATOL, f"step {step}"
        tokens = out["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        torch_tokens = ref[:, -1].argmax(-1, keepdim=True)
        ort_seq.append(tokens[:, 0])
        torch_seq.append(torch_tokens[:, 0].numpy())
        past = presents(out, L)
    assert np.array_equal(np.stack(ort_seq), np.stack(torch_seq))

    # Cached vs uncached: the whole target at once with an empty past gives the same greedy tokens.
    target = np.concatenate([np.full((3, 1), bos, dtype=np.int64), np.stack(ort_seq[:-1], axis=1)], axis=1)
    T = target.shape[1]
    out = exported.run("decoder", {"input_ids": target, "attention_mask": np.ones((3, T), dtype=np.int64),
                                   "position_ids": np.tile(np.arange(T), (3, 1)), "encoder_attention_mask": src_mask,
                                   **kv_feeds("cross", cross),
                                   **kv_feeds("past_key_values", [np.zeros((3, H, 0, Dh), np.float32)] * (2 * L))})
    assert np.array_equal(out["logits"].argmax(-1).T, np.stack(ort_seq))


def test_classifier_parity(tiny: dict[str, Exported]) -> None:
    exported = tiny["classifier"]
    rng = np.random.default_rng(2)
    ids = rng.integers(5, exported.config["vocab_size"], (3, 8)).astype(np.int64)
    mask = np.array([[1] * 8, [1] * 4 + [0] * 4, [1] * 6 + [0] * 2], dtype=np.int64)
    types = np.zeros_like(ids)
    types[0, 5:] = 1
    out = exported.run("encoder", {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
    with torch.no_grad():
        ref, weights = exported.model.eval()(torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(mask))
    assert np.abs(out["logits"] - ref.numpy()).max() <= ATOL
    assert np.abs(out["attentions.0"] - weights[0].numpy()).max() <= ATOL


def grid_feeds(config: dict[str, Any], role: str, B: int, S: int, P: int) -> dict[str, np.ndarray]:
    """Inputs of any size for one graph, built from config.json's symbolic shapes."""
    sizes = {"batch": B, "seq": S, "src": S + 1, "past": P, "total": P + S}
    feeds = {}
    for spec in config["graphs"][role]["inputs"]:
        if "default" in spec:
            continue  # optional (logits_to_keep): left at its default, all positions
        shape = [sizes[d] if isinstance(d, str) else d for d in spec["shape"]]
        if spec["name"] == "position_ids":
            feeds[spec["name"]] = np.tile(np.arange(P, P + S, dtype=np.int64), (B, 1))
        elif spec["dtype"] == "int64":
            feeds[spec["name"]] = np.ones(shape, dtype=np.int64) * (5 if spec["name"] == "input_ids" else 1)
        else:
            feeds[spec["name"]] = np.zeros(shape, dtype=np.float32)
    if "token_type_ids" in feeds:
        feeds["token_type_ids"][:] = 0
    return feeds


def test_shape_grid(exported: Exported) -> None:
    """Every graph runs for batch 1..4, sequence 1..5 and past 0..5 (catches a frozen dimension)."""
    config = exported.config
    vocab = config["vocab_size"]
    for role, graph in config["graphs"].items():
        cached = any(i["name"].startswith("past_") for i in graph["inputs"])
        for B in range(1, 5):
            for S in range(1, 6):
                for P in range(6) if cached else [0]:
                    out = exported.run(role, grid_feeds(config, role, B, S, P))
                    if "logits" in out:
                        expected = (B, S, vocab) if cached else (B, len(config.get("labels", [])))
                        assert out["logits"].shape == expected, (role, B, S, P)
                    if cached:
                        assert out["present.0.key"].shape[:3] == (B, config["dims"]["n_heads"], P + S)
                    if role == "encoder" and "cross.0.key" in out:
                        assert out["cross.0.key"].shape[:3] == (B, config["dims"]["n_heads"], S + 1)


def test_int8_variant_runs_and_tracks_fp32(exported: Exported) -> None:
    config = exported.config
    for role, graph in config["graphs"].items():
        assert graph["int8_file"], "export writes an int8 variant"
        feeds = grid_feeds(config, role, 2, 4, 3)
        fp32 = exported.run(role, feeds)
        int8 = exported.run(role, feeds, int8=True)
        for name, value in fp32.items():
            assert int8[name].shape == value.shape
        first = next(iter(fp32))
        correlation = np.corrcoef(fp32[first].ravel(), int8[first].ravel())[0, 1]
        assert correlation > 0.95, (role, first, correlation)
