"""A decoder checkpoint's ``generation_config.json``: end tokens and default sampling settings.

What the engine does (several end tokens, the sampling settings of service/engine/tokens/sampling.py, a default
``max_new_tokens``) is taken over; a setting that would change the outputs and that the engine does not
do (multi-token ``bad_words_ids``, beam search, n-gram blocking, ...) is a CheckpointError that names it, never
silently dropped. Settings that do not change the tokens (``use_cache``, output flags) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.families.base import CheckpointError
from model.network.config import GeneratorConfig, TranslatorConfig

FILE = "generation_config.json"
# generation_config.json key -> the served default it becomes (service/engine/tokens/sampling.py names).
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "repetition_penalty": "repetition_penalty"}
# Keys that change the outputs and are not built, with the value that means "off".
UNSUPPORTED_UNLESS = {
    "num_beams": 1, "num_beam_groups": 1, "no_repeat_ngram_size": 0, "min_length": 0,
    "min_new_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": 0.0,
    "diversity_penalty": 0.0, "encoder_repetition_penalty": 1.0, "penalty_alpha": None, "guidance_scale": 1.0,
    "sequence_bias": None, "exponential_decay_length_penalty": None, "constraints": None,
    "force_words_ids": None, "watermarking_config": None, "renormalize_logits": False,
    "prompt_lookup_num_tokens": None, "assistant_model": None, "dola_layers": None, "stop_strings": None,
    "max_time": None, "epsilon": None,
}


@dataclass(frozen=True)
class GenerationSettings:
    eos_ids: list[int] = field(default_factory=list)  # every end token, in the file's order
    bos: int | None = None
    pad: int | None = None
    # temperature, top_p, top_k, repetition_penalty, max_new_tokens
    defaults: dict[str, Any] = field(default_factory=dict)
    banned: list[int] = field(default_factory=list)  # single-token bad_words_ids: never generated
    forced_bos: int | None = None  # the first generated token (a multilingual translator's target language)
    decoder_start: int | None = None


def token_ids(value: Any, key: str) -> list[int]:
    """An id or a list of ids (``eos_token_id: [128001, 128009]``)."""
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"{FILE}: {key} must be a token id or a list of token ids, got {value!r}")
    return list(values)


def read_generation_config(folder: Path, max_positions: int,
                           allowed: frozenset[str] = frozenset()) -> GenerationSettings:
    """The folder's generation settings (none without the file); ``allowed``: keys of UNSUPPORTED_UNLESS (and
    ``max_length``) the caller's engine handles itself (a translator's beams and forced first token)."""
    path = folder / FILE
    if not path.is_file():
        return GenerationSettings()
    data: dict[str, Any] = json.loads(path.read_text())
    for key, off in UNSUPPORTED_UNLESS.items():
        value = data.get(key, off)
        if key not in allowed and value != off and value not in (None, [], {}):
            raise CheckpointError(f"{FILE}: {key}={value!r} is not supported by the server's generation")
    max_length = data.get("max_length")
    if "max_length" not in allowed and max_length is not None and max_length < max_positions:
        raise CheckpointError(f"{FILE}: max_length={max_length!r} below the model's {max_positions} positions "
                              "is not supported (the server bounds max_new_tokens, not the total length)")
    eos = token_ids(data["eos_token_id"], "eos_token_id") if data.get("eos_token_id") is not None else []
    banned = banned_tokens(data.get("bad_words_ids"))
    # As vLLM does: the sampling values the file states become defaults; do_sample is not one (a request
    # chooses greedy with temperature 0).
    defaults: dict[str, Any] = {ours: data[key] for key, ours in SAMPLING_KEYS.items() if data.get(key) is not None}
    if data.get("max_new_tokens") is not None:
        defaults["max_new_tokens"] = int(data["max_new_tokens"])
    return GenerationSettings(
        eos_ids=eos,
        bos=data.get("bos_token_id") if isinstance(data.get("bos_token_id"), int) else None,
        pad=data.get("pad_token_id") if isinstance(data.get("pad_token_id"), int) else None,
        defaults=defaults,
        banned=banned,
        forced_bos=token_or_none(data, "forced_bos_token_id"),
        decoder_start=token_or_none(data, "decoder_start_token_id"),
    )


def token_or_none(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) else None


def banned_tokens(bad_words: Any) -> list[int]:
    """Single-token ``bad_words_ids`` ([[id], ...]) are tokens never generated; a longer sequence would need
    matching what was generated before it, which the server does not do."""
    if not bad_words:
        return []
    if not isinstance(bad_words, list) or not all(isinstance(w, list) for w in bad_words):
        raise CheckpointError(f"{FILE}: bad_words_ids must be a list of token-id lists, got {bad_words!r}")
    longer = [w for w in bad_words if len(w) != 1]
    if longer:
        raise CheckpointError(f"{FILE}: bad_words_ids with multi-token sequences ({longer[:3]}) is not supported "
                              "(single tokens are)")
    return [token_ids(w[0], "bad_words_ids")[0] for w in bad_words]


def apply_generation_config(config: GeneratorConfig, folder: Path, hf: dict[str, Any]) -> None:
    """The end tokens transformers' generate() stops at (generation_config.json's, else config.json's), where
    they are more than special_tokens["eos"], and the file's defaults, into ``config``."""
    settings = read_generation_config(folder, config.max_positions)
    eos = settings.eos_ids or (token_ids(hf["eos_token_id"], "eos_token_id") if hf.get("eos_token_id") is not None
                               else [])
    if eos and eos != [config.special_tokens.get("eos")]:
        config.eos_token_ids = eos
    config.generation_defaults = settings.defaults
    config.bad_words_ids = [[t] for t in settings.banned]


# A translator's beam search has its own settings: the request's num_beams (default 4) and stopping rule apply,
# the forced first token is honoured; what would change the outputs otherwise (a length penalty other than 1.0,
# sampling, penalties, banned words, a default length) is refused.
SEQ2SEQ_ALLOWED = frozenset({"num_beams", "forced_bos_token_id", "max_length", "early_stopping"})
SEQ2SEQ_UNSUPPORTED_UNLESS = {"length_penalty": 1.0, "do_sample": False, "repetition_penalty": 1.0,
                              "max_new_tokens": None, "bad_words_ids": None}


def apply_seq2seq_generation_config(config: TranslatorConfig, folder: Path, hf: dict[str, Any]) -> None:
    """A translator's forced first token and start token from generation_config.json (else config.json); the
    start and end tokens must be the ones special_tokens already holds (the engine has one of each)."""
    settings = read_generation_config(folder, config.max_positions, SEQ2SEQ_ALLOWED)
    data: dict[str, Any] = json.loads((folder / FILE).read_text()) if (folder / FILE).is_file() else {}
    for key, off in SEQ2SEQ_UNSUPPORTED_UNLESS.items():
        if data.get(key, off) not in (off, None):
            raise CheckpointError(f"{FILE}: {key}={data[key]!r} is not supported by the server's translation")
    start = settings.decoder_start if settings.decoder_start is not None else hf.get("decoder_start_token_id")
    if start is not None and start != config.special_tokens.get("bos"):
        raise CheckpointError(f"{FILE}: decoder_start_token_id={start!r} differs from config.json's "
                              f"{config.special_tokens.get('bos')!r}")
    eos = settings.eos_ids or []
    if eos and eos != [config.special_tokens.get("eos")]:
        raise CheckpointError(f"{FILE}: eos_token_id={eos!r} is not supported (one end token, "
                              f"{config.special_tokens.get('eos')!r})")
    forced = settings.forced_bos if settings.forced_bos is not None else hf.get("forced_bos_token_id")
    config.forced_bos_token_id = forced if isinstance(forced, int) else None
