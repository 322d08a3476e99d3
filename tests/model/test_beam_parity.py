"""The server's beam search (the engine on the committed artifacts/translator) returns the same token ids
as the PyTorch reference (`model/network/decoding.py::beam_search`, what the model card's BLEU is measured with)."""

from pathlib import Path

import pytest

pytest.importorskip("torch")  # the training extra
import torch

from model.network.decoding import beam_search
from model.training.checkpoint import weights_from_artifact
from service.engine.metrics import Metrics
from service.engine.tasks.translation.decoding import TranslationModel, TranslationParams, TranslationSequence
from service.runtime.artifact import load_artifact
from service.runtime.sessions import GraphSession, RuntimeOptions

ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "translator"
pytestmark = pytest.mark.skipif(not (ARTIFACT / "config.json").is_file(), reason="artifacts/translator is absent")

VERSES = [  # World English Bible
    "In the beginning, God created the heavens and the earth.",
    "God said, \u201cLet there be light,\u201d and there was light.",
    "Yahweh is my shepherd; I shall lack nothing.",
    "Blessed are the gentle, for they shall inherit the earth.",
    "Jesus wept.",
    "For God so loved the world, that he gave his one and only Son, that whoever believes in him should not "
    "perish, but have eternal life.",
    "Love is patient and is kind; love doesn\u2019t envy.",
    "The earth was formless and empty. Darkness was on the surface of the deep and God\u2019s Spirit was hovering "
    "over the surface of the waters.",
]
SETTINGS = [  # the server default (the card's), and a longer-favouring penalty with 3 beams and 2 answers
    TranslationParams(num_beams=4, n_best=1, length_penalty=1.0, no_repeat_ngram_size=3),
    TranslationParams(num_beams=3, n_best=2, length_penalty=0.6, no_repeat_ngram_size=2),
]


def server(params: TranslationParams, sources: list[list[int]]) -> list[list[tuple[list[int], float]]]:
    """All verses in one batch through the engine's model and batch classes, as the scheduler drives them."""
    artifact = load_artifact(ARTIFACT)
    options = RuntimeOptions(device="cpu", intra_op_threads=2)
    encoder, decoder = (GraphSession(artifact.name, artifact.graphs[role], options) for role in ("encoder", "decoder"))
    model = TranslationModel(artifact.name, artifact, encoder, decoder, artifact.load_tokenizer(), Metrics())
    sequences = [TranslationSequence(src, params, 2 * len(src) + 10) for src in sources]
    _, batch = model.prefill(list(sequences))
    results = {}
    while batch is not None and batch.sequences:
        for emit in batch.step():
            if emit.final:
                results[id(emit.sequence)] = [(h.token_ids, h.score) for h in emit.event.hypotheses]
    return [results[id(seq)] for seq in sequences]


@pytest.fixture(scope="module")
def reference_model() -> torch.nn.Module:
    model, _ = weights_from_artifact("translator", ARTIFACT)
    return model


@pytest.mark.parametrize("params", SETTINGS, ids=["default", "beam3-lp0.6-ngram2"])
def test_server_beam_search_equals_the_pytorch_reference(params: TranslationParams, reference_model) -> None:
    model = reference_model
    tokenizer = load_artifact(ARTIFACT).load_tokenizer()
    sources = [e.ids for e in tokenizer.encode_batch(VERSES)]
    ours = server(params, sources)
    for src, answer in zip(sources, ours, strict=True):
        ids = torch.tensor([src])
        reference = beam_search(
            model, ids, torch.ones_like(ids), params.num_beams, 2 * len(src) + 10, params.length_penalty,
            params.no_repeat_ngram_size, params.n_best,
        )
        assert [tokens for tokens, _ in answer] == [h.tokens for h in reference], tokenizer.decode(src)
        assert [score for _, score in answer] == pytest.approx([h.score for h in reference], abs=1e-3)
