from pathlib import Path

from tokenizers import Tokenizer

from service.engine.tokens.streaming import REPLACEMENT, IncrementalDecoder, TextStream

TEXT = "Déjà vu: 東京 🙂 naïve café « bien sûr » 👩‍🔬!"


def tokenizer(tiny_artifacts: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_artifacts / "generator" / "tokenizer.json"))


def test_pieces_are_whole_characters_and_add_up(tiny_artifacts: Path) -> None:
    tok = tokenizer(tiny_artifacts)
    ids = tok.encode(TEXT).ids
    # Byte-level BPE splits these characters across tokens: the premise of the test.
    assert any(REPLACEMENT in tok.decode([i]) for i in ids)
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(pieces) == tok.decode(ids) == TEXT
    assert all(REPLACEMENT not in p for p in pieces)
    for piece in pieces:
        piece.encode("utf-8")  # a lone surrogate would raise


def test_invalid_bytes_surface_at_the_end(tiny_artifacts: Path) -> None:
    tok = tokenizer(tiny_artifacts)
    partial = tok.encode("東").ids[:-1]  # an incomplete character
    decoder = IncrementalDecoder(tok)
    assert "".join(decoder.push(i) for i in partial) == ""
    assert REPLACEMENT in decoder.flush()


def test_stop_string_is_cut_and_never_leaks(tiny_artifacts: Path) -> None:
    tok = tokenizer(tiny_artifacts)
    stream = TextStream(tok, stop=["bien sûr"])
    released = []
    for i in tok.encode(TEXT).ids:
        released.append(stream.push(i))
        if stream.stopped:
            break
    released.append(stream.finish())
    text = "".join(released)
    assert stream.stopped
    assert text == TEXT[: TEXT.index("bien sûr")]
    assert "bien" not in text


def test_partial_stop_is_held_then_released(tiny_artifacts: Path) -> None:
    tok = tokenizer(tiny_artifacts)
    stream = TextStream(tok, stop=["café!"])
    pieces = [stream.push(i) for i in tok.encode("naïve café « bien").ids]
    assert not stream.stopped
    assert "".join(pieces) + stream.finish() == "naïve café « bien"
