"""The three architectures on tiny configs: shapes, masking, caching, decoding and learning."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the training extra; .ci/run installs it
import torch

from model.network.classifier import Classifier
from model.network.config import ClassifierConfig, GeneratorConfig, TranslatorConfig
from model.network.decoding import (
    banned_tokens,
    beam_search,
    filter_logits,
    generate,
    generate_uncached,
    translate_greedy,
    translate_greedy_uncached,
)
from model.network.generator import Generator
from model.network.layers import positions_from_mask
from model.network.translator import Translator
from model.tasks.classification import mask_tokens

V = 50
SPECIAL = {"pad": 0, "unk": 1, "bos": 2, "eos": 3}


def tiny_translator() -> Translator:
    torch.manual_seed(0)
    config = TranslatorConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                              dropout=0.0, max_positions=64, special_tokens=SPECIAL)
    return Translator(config).eval()


def tiny_generator() -> Generator:
    torch.manual_seed(0)
    return Generator(GeneratorConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                                     max_positions=64)).eval()


def tiny_classifier(pooling: str = "cls") -> Classifier:
    torch.manual_seed(0)
    return Classifier(ClassifierConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                                       max_positions=64, pooling=pooling)).eval()


def ids(B: int, S: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, V, (B, S), generator=torch.Generator().manual_seed(seed))


# --- shapes -----------------------------------------------------------------------------------------


def test_translator_shapes() -> None:
    model = tiny_translator()
    src, tgt = ids(3, 7), ids(3, 5, 1)
    logits = model(src, torch.ones_like(src), tgt, torch.ones_like(tgt))
    assert logits.shape == (3, 5, V)
    memory, weights = model.encode(src, torch.ones_like(src))
    assert memory.shape == (3, 7, 32) and weights[0].shape == (3, 4, 7, 7)
    cross = model.cross_kv(memory)
    assert len(cross) == 2 and cross[0][0].shape == (3, 4, 7, 8)


def test_generator_shapes_and_cache_shapes() -> None:
    model = tiny_generator()
    logits, present, weights = model(ids(2, 6))
    assert logits.shape == (2, 6, V)
    assert present[0][0].shape == (2, 4, 6, 8) and weights[1].shape == (2, 4, 6, 6)
    logits, present, weights = model(ids(2, 1), torch.ones(2, 7, dtype=torch.long), torch.full((2, 1), 6), present)
    assert logits.shape == (2, 1, V) and present[0][1].shape == (2, 4, 7, 8) and weights[0].shape == (2, 4, 1, 7)


def test_classifier_shapes() -> None:
    model = tiny_classifier()
    x = ids(4, 9)
    logits, weights = model(x, torch.zeros_like(x), torch.ones_like(x))
    assert logits.shape == (4, 2) and len(weights) == 2 and weights[0].shape == (4, 4, 9, 9)
    hidden, _ = model.encode(x, torch.zeros_like(x), torch.ones_like(x))
    assert model.mlm_logits(hidden).shape == (4, 9, V) and model.nsp_head(model.pooled(hidden)).shape == (4, 2)


# --- masking ----------------------------------------------------------------------------------------


def test_causal_mask_future_tokens_do_not_change_earlier_logits() -> None:
    model = tiny_generator()
    a = ids(1, 10)
    b = a.clone()
    b[0, 6:] = ids(1, 4, 7)[0]  # change only positions 6..9
    la, _, _ = model(a)
    lb, _, _ = model(b)
    assert torch.allclose(la[0, :6], lb[0, :6], atol=1e-6)
    assert not torch.allclose(la[0, 6:], lb[0, 6:], atol=1e-3)


def test_translator_decoder_is_causal() -> None:
    model = tiny_translator()
    src, tgt = ids(1, 6), ids(1, 8, 1)
    changed = tgt.clone()
    changed[0, 5:] = ids(1, 3, 9)[0]
    la = model(src, torch.ones_like(src), tgt, torch.ones_like(tgt))
    lb = model(src, torch.ones_like(src), changed, torch.ones_like(changed))
    assert torch.allclose(la[0, :5], lb[0, :5], atol=1e-6)


def test_left_padding_does_not_change_real_tokens() -> None:
    model = tiny_generator()
    prompt = ids(1, 5)
    alone, _, _ = model(prompt)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    batched, _, _ = model(padded, mask, positions_from_mask(mask, 8))
    assert torch.allclose(alone[0], batched[0, 3:], atol=1e-5)
    assert not torch.isnan(batched).any()  # fully masked pad rows stay finite (finfo.min, not -inf)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_right_padding_does_not_change_encoder_or_classifier(pooling: str) -> None:
    translator, classifier = tiny_translator(), tiny_classifier(pooling)
    src = ids(1, 5)
    padded = torch.cat([src, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    memory, _ = translator.encode(src, torch.ones_like(src))
    memory_padded, _ = translator.encode(padded, mask)
    assert torch.allclose(memory[0], memory_padded[0, :5], atol=1e-5)
    alone, _ = classifier(src, torch.zeros_like(src), torch.ones_like(src))
    with_pad, _ = classifier(padded, torch.zeros_like(padded), mask)
    assert torch.allclose(alone, with_pad, atol=1e-5)
    if pooling == "mean":  # and it reads every token, not [CLS] alone
        changed = src.clone()
        changed[0, -1] = (changed[0, -1] + 1) % V
        assert not torch.allclose(alone, classifier(changed, torch.zeros_like(src), torch.ones_like(src))[0])


def test_an_unknown_pooling_is_refused() -> None:
    with pytest.raises(ValueError, match="pooling"):
        ClassifierConfig(vocab_size=V, pooling="max")


# --- cached vs recomputed ---------------------------------------------------------------------------


def test_generator_cached_decoding_equals_recompute() -> None:
    model = tiny_generator()
    prompts = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids(1, 4)], dim=1).repeat(2, 1)
    prompts[1] = ids(1, 6, 3)[0]
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    cached = generate(model, prompts, mask, 12)
    assert torch.equal(cached, generate_uncached(model, prompts, mask, 12))
    # logits: one cached step vs the full sequence
    _, past, _ = model(prompts, mask, positions_from_mask(mask, 6))
    step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    step, _, _ = model(cached[:, :1], step_mask, positions_from_mask(step_mask, 1), past)
    full_ids = torch.cat([prompts, cached[:, :1]], dim=1)
    full, _, _ = model(full_ids, step_mask, positions_from_mask(step_mask, 7))
    assert (step[:, -1] - full[:, -1]).abs().max() < 1e-5


def test_translator_cached_decoding_equals_recompute() -> None:
    model = tiny_translator()
    src = ids(3, 6)
    mask = torch.ones_like(src)
    mask[1, 4:] = 0
    assert translate_greedy(model, src, mask, 15) == translate_greedy_uncached(model, src, mask, 15)


# --- decoding ---------------------------------------------------------------------------------------


def test_beam_search_with_one_beam_equals_greedy() -> None:
    model = tiny_translator()
    for seed in range(3):
        src = ids(1, 5, seed)
        greedy = translate_greedy(model, src, torch.ones_like(src), 12)[0]
        beam = beam_search(model, src, torch.ones_like(src), num_beams=1, max_new_tokens=12, length_penalty=0.0)
        assert beam[0].tokens == greedy


def test_beam_search_returns_sorted_n_best() -> None:
    model = tiny_translator()
    src = ids(1, 5)
    hyps = beam_search(model, src, torch.ones_like(src), num_beams=4, max_new_tokens=10, n_best=3)
    assert len(hyps) == 3
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == 3


def test_no_repeat_ngram_bans_repeats() -> None:
    assert banned_tokens([5, 6, 7, 5, 6], 3) == [7]
    assert banned_tokens([5, 6], 3) == []


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 1.0, 2, 1.0)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, 1.0, 0, 0.7)[0])
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.7, 0.5 + 0.3 crosses it


# --- MLM masking ------------------------------------------------------------------------------------


def test_mlm_masking_proportions() -> None:
    n = 200_000
    tokens = torch.randint(5, 1000, (1, n))
    maskable = torch.ones_like(tokens, dtype=torch.bool)
    maskable[0, :1000] = False  # e.g. [CLS]/[SEP]/padding are never chosen
    inputs, labels = mask_tokens(tokens, maskable, mask_id=4, vocab_size=1000, n_special=5,
                                 generator=torch.Generator().manual_seed(0))
    chosen = labels != -100
    assert not chosen[0, :1000].any()
    assert abs(chosen.float().mean().item() - 0.15 * 199_000 / n) < 0.005
    as_mask = (inputs == 4) & chosen
    unchanged = (inputs == tokens) & chosen
    random_ = chosen & ~as_mask & ~unchanged
    total = chosen.sum().item()
    assert abs(as_mask.sum().item() / total - 0.8) < 0.01
    assert abs(random_.sum().item() / total - 0.1) < 0.01  # a random token equal to the original counts as unchanged
    assert abs(unchanged.sum().item() / total - 0.1) < 0.01
    assert torch.equal(labels[chosen], tokens[chosen])


def test_whole_word_masking_chooses_every_piece_of_a_word_together() -> None:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 1000, (64, 120))
    word_starts = torch.rand(tokens.shape, generator=generator) < 0.5  # words of 1-several pieces
    word_starts[:, 0] = True
    maskable = torch.ones_like(tokens, dtype=torch.bool)
    _, labels = mask_tokens(tokens, maskable, mask_id=4, vocab_size=1000, n_special=5,
                            generator=generator, word_starts=word_starts)
    chosen = labels != -100
    word_of = word_starts.long().cumsum(dim=1)  # a word id per token, within its row
    for row in range(tokens.shape[0]):
        for word in torch.unique(word_of[row]):
            pieces = chosen[row][word_of[row] == word]
            assert pieces.all() or not pieces.any()  # a word is predicted whole or not at all
    words = word_starts.sum().item()
    chosen_words = (chosen & word_starts).sum().item()
    assert abs(chosen_words / words - 0.15) < 0.02


def test_nsp_pairs_cut_one_sentence_documents_between_words() -> None:
    import random

    from model.tasks.classification import segment_pair

    docs = [["a truly great film about friendship"], ["First sentence here.", "Second one follows.", "Third."]]
    rng = random.Random(0)
    labels = []
    for _ in range(400):
        a, b, label = segment_pair(docs, rng)
        assert a and b
        labels.append(label)
        if label == 0:  # the real continuation: A then B is a contiguous stretch of one document
            assert any(f"{a} {b}" in " ".join(doc) for doc in docs)
    assert 0.4 < sum(labels) / len(labels) < 0.6


# --- learning ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["translator", "generator", "classifier"])
def test_a_few_training_steps_reduce_the_loss(kind: str) -> None:
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = {"translator": tiny_translator, "generator": tiny_generator, "classifier": tiny_classifier}[kind]().train()
    x = ids(8, 10)
    y = torch.randint(0, 2, (8,), generator=torch.Generator().manual_seed(1))

    def loss() -> torch.Tensor:
        if kind == "translator":
            logits = model(x, torch.ones_like(x), x[:, :-1], torch.ones_like(x[:, :-1]))
            return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        if kind == "generator":
            logits, _, _ = model(x[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        logits, _ = model(x, torch.zeros_like(x), torch.ones_like(x))
        return F.cross_entropy(logits, y)

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = loss().item()
    for _ in range(40):
        optimizer.zero_grad()
        torch.autograd.backward(loss())
        optimizer.step()
    assert loss().item() < 0.7 * first
