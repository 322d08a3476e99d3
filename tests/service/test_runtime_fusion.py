"""Fused self-attention (service/runtime/fusion.py): the same numbers as the graphs as exported, attention
maps still served, and graphs without the pattern left alone."""

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from contract.names import ATTENTIONS, PAST, PRESENT, kv_names, layer_names
from service.engine.tasks.generation.decoding import GenerationParams
from service.engine.tasks.translation.request import TranslationParams
from service.engine.tasks.translation.service import TranslationJob
from service.engine.tokens.sampling import SamplingParams
from service.runtime.artifact import load_artifact
from service.runtime.fusion import fuse_attention
from service.runtime.sessions import GraphSession, RuntimeOptions


def sessions(folder: Path, quantization: str = "none") -> tuple[GraphSession, GraphSession]:
    spec = load_artifact(folder).graphs["decoder"]
    options = RuntimeOptions(device="cpu", intra_op_threads=1, quantization=quantization)
    fused = GraphSession(folder.name, spec, options)
    plain = GraphSession(folder.name, spec, replace(options, fuse_attention=False))
    assert fused.quantization == plain.quantization == quantization
    return fused, plain


def decoder_feeds(folder: Path, rows: int, new: int, past: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random feeds for a decoder call: `new` tokens per row after `past` cached ones, row 0 left-padded by
    two, and for a translator random encoder K/V of a right-padded source."""
    artifact = load_artifact(folder)
    layers, heads, d_head = artifact.n_decoder_layers, artifact.n_kv_heads, artifact.d_head
    mask = np.ones((rows, past + new), np.int64)
    mask[0, :2] = 0
    feeds = {
        "input_ids": rng.integers(4, artifact.vocab_size, (rows, new)),
        "attention_mask": mask,
        "position_ids": np.maximum(np.cumsum(mask, 1)[:, -new:] - 1, 0),
    }
    for name in kv_names(PAST, layers):
        feeds[name] = rng.standard_normal((rows, heads, past, d_head)).astype(np.float32)
    spec = artifact.graphs["decoder"]
    if "encoder_attention_mask" in spec.input_names:
        source = np.ones((rows, 6), np.int64)
        source[1, 4:] = 0
        feeds["encoder_attention_mask"] = source
        for name in kv_names("cross", layers):
            feeds[name] = rng.standard_normal((rows, artifact.n_heads, 6, d_head)).astype(np.float32)
    return {k: v for k, v in feeds.items() if k in spec.input_names}


DECODERS = [("generator", "none"), ("translator", "none"), ("generator", "int8")]


@pytest.mark.parametrize(("kind", "quantization"), DECODERS)
@pytest.mark.parametrize(("new", "past"), [(5, 0), (3, 4), (1, 7)])  # a prompt, a prompt's chunk, a step
def test_fused_decoder_computes_what_the_exported_graph_does(
    tiny_artifacts: Path, kind: str, quantization: str, new: int, past: int
) -> None:
    folder = tiny_artifacts / kind
    fused, plain = sessions(folder, quantization)
    layers = load_artifact(folder).n_decoder_layers
    assert fused.fusion is not None and plain.fusion is None
    merged = layers if quantization == "none" else 0  # int8 projections are not plain matmuls: left apart
    assert fused.fusion.attentions == layers and fused.fusion.merged_projections == merged
    feeds = decoder_feeds(folder, 2, new, past, np.random.default_rng(new + past))
    outputs = ["logits", *kv_names(PRESENT, layers)]
    got, want = fused.run(feeds, outputs), plain.run(feeds, outputs)
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_attention_maps_come_from_the_exported_graph(tiny_artifacts: Path) -> None:
    folder = tiny_artifacts / "generator"
    fused, plain = sessions(folder)
    layers = load_artifact(folder).n_decoder_layers
    maps = layer_names(ATTENTIONS, layers)
    assert all(fused.has_output(name) for name in maps)
    assert not any(o.name in maps for o in fused.session.get_outputs())  # the fused graph itself lacks them
    feeds = decoder_feeds(folder, 2, 3, 4, np.random.default_rng(0))
    got, want = fused.run(feeds, ["logits", *maps]), plain.run(feeds, ["logits", *maps])
    for name in ["logits", *maps]:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("kind", "graph"), [("classifier", "encoder"), ("translator", "encoder")])
def test_fused_encoder_computes_what_the_exported_graph_does(tiny_artifacts: Path, kind: str, graph: str) -> None:
    """Encoders' attention has no cache and a mask broadcast over the queries; padded rows included."""
    artifact = load_artifact(tiny_artifacts / kind)
    spec = artifact.graphs[graph]
    fused = GraphSession(kind, spec, RuntimeOptions(device="cpu", intra_op_threads=1))
    plain = GraphSession(kind, spec, RuntimeOptions(device="cpu", intra_op_threads=1, fuse_attention=False))
    layers = artifact.dims.get("n_encoder_layers", artifact.dims.get("n_layers"))
    assert fused.fusion is not None and fused.fusion.attentions == layers
    rng = np.random.default_rng(3)
    ids = rng.integers(4, artifact.vocab_size, (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v for k, v in feeds.items() if k in spec.input_names}
    outputs = [*spec.output_names]  # the attention maps too: they come from the exported graph
    got, want = fused.run(feeds, outputs), plain.run(feeds, outputs)
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    without_maps = [n for n in outputs if not n.startswith(f"{ATTENTIONS}.")]
    got = fused.run(feeds, without_maps)
    for name in without_maps:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_graph_without_attention_is_left_alone() -> None:
    from service.runtime.scoring_head import GRAPH

    assert fuse_attention(onnx.load(str(GRAPH))) is None


def test_an_attention_read_elsewhere_is_not_fused(tiny_artifacts: Path) -> None:
    """A graph where a softmax feeds something besides its value matmul (not our exporter's pattern)."""
    model = onnx.load(str(load_artifact(tiny_artifacts / "generator").graphs["decoder"].file))
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    model.graph.node.append(onnx.helper.make_node("Identity", [softmaxes[0].output[0]], ["extra"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    fused = fuse_attention(model)
    assert fused is not None and fused.fusion.attentions == len(softmaxes) - 1


async def test_served_tokens_are_the_same_with_and_without_fusion(serving) -> None:
    prompts = ["Hello", "The movie was wonderful, a delight from start", "x"]
    params = [
        GenerationParams(max_new_tokens=10, sampling=SamplingParams(temperature=0.0), ignore_eos=True),
        GenerationParams(max_new_tokens=10, sampling=SamplingParams(temperature=0.9, top_k=20, seed=5)),
    ]
    texts = ["The house is small.", "I love you and the river is long"]
    translation = [TranslationParams(num_beams=1, max_new_tokens=10), TranslationParams(num_beams=3, max_new_tokens=10)]

    async def everything(s) -> list[object]:
        gen, tr = s.engine.generator, s.engine.translator
        generated = await asyncio.gather(
            *(gen.scheduler.submit([gen.sequence(gen.tokenize(p, "prompt"), q)], None, "prompt").result()
              for p in prompts for q in params)
        )  # fmt: skip
        jobs = [await tr.submit(TranslationJob(texts, ["text"] * len(texts), q)) for q in translation]
        translated = await asyncio.gather(*(job.results() for job in jobs))
        tokens = [[t.id for t in r.tokens] for r in generated]
        return tokens + [[(h.token_ids, round(h.score, 4)) for h in r.hypotheses] for rs in translated for r in rs]

    async with serving(fuse_attention=False, max_batch_size=8) as s:
        assert s.engine.generator.model.session.fusion is None
        want = await everything(s)
    async with serving(max_batch_size=8) as s:
        session = s.engine.generator.model.session
        assert session.fusion is not None
        got = await everything(s)
        assert session._full_session is None  # start-up checks and warm-up ask for no attention maps
    assert got == want


def test_a_fused_graph_that_does_not_load_falls_back_to_the_exported_one(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Say an ONNX Runtime build without the fused node: the server still serves the graph as exported."""
    from service.runtime import sessions as module

    def broken(model: onnx.ModelProto, weights: object) -> object:
        fused = fuse_attention(model)
        assert fused is not None
        fused.model.graph.node[0].op_type = "NoSuchOperator"
        return fused

    monkeypatch.setattr(module, "fuse_attention", broken)
    spec = load_artifact(tiny_artifacts / "generator").graphs["decoder"]
    session = GraphSession("generator", spec, RuntimeOptions(device="cpu", intra_op_threads=1))
    assert session.fusion is None and "serving the graph as exported" in caplog.text


def test_a_graph_whose_weights_come_in_a_package_is_fused_with_them() -> None:
    """The served embedder: its Q/K/V weights come from the installed package, merged as the graph loads;
    the exported graph, opened for attention maps, still gets every package tensor."""
    artifact = load_artifact(Path(__file__).resolve().parents[2] / "artifacts" / "embedder")
    assert artifact.weights_package is not None
    weights = artifact.weights_package.load()
    spec = artifact.graphs["encoder"]
    options = RuntimeOptions(device="cpu", intra_op_threads=1)
    fused = GraphSession("embedder", spec, options, initializers=weights)
    plain = GraphSession("embedder", spec, replace(options, fuse_attention=False), initializers=weights)
    assert fused.fusion is not None and fused.fusion.merged_projections == artifact.dims["n_layers"]
    ids = np.random.default_rng(0).integers(5, artifact.vocab_size, (2, 7))
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v for k, v in feeds.items() if k in spec.input_names}
    names = [n for n in spec.output_names if not n.startswith(f"{ATTENTIONS}.")]
    got, want = fused.run(feeds, names), plain.run(feeds, names)
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    maps = layer_names(ATTENTIONS, artifact.dims["n_layers"])
    np.testing.assert_allclose(fused.run(feeds, maps)[maps[0]], plain.run(feeds, maps)[maps[0]], atol=1e-6)
