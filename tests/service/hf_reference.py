"""transformers' side of the tests that serve imported checkpoints (shared by the test_api_* files on
hf_imports, hf_seq2seq_imports, hf_decoder_imports and chat_import): the fp16-rounded reference model, the
artifact's tokenizer, generate() on unpadded prompts, and `serving` on an import folder's artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from tokenizers import Tokenizer

from model.importing import hf_parity

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.generation.utils import GenerateOutput

Serving = Callable[..., AbstractAsyncContextManager[Any]]


class Generative(Protocol):
    """A model's generate() as these tests call it. transformers annotates the method's self with a Protocol
    written for another checker, which no model class satisfies under mypy: hence a cast to this one."""

    def generate(self, inputs: torch.Tensor, **kwargs: Any) -> GenerateOutput | torch.LongTensor: ...


def reference(imports: Path, name: str) -> PreTrainedModel:
    """transformers' model with its weights rounded as the exported graph stores them (fp16)."""
    folder = imports / "checkpoints" / name
    family = json.loads((folder / "config.json").read_text())["model_type"]
    return hf_parity.fp16_rounded(hf_parity.load_hf_model(folder, family))


def tokenizer(imports: Path, name: str) -> Tokenizer:
    """The tokenizer.json of the imported artifact."""
    return Tokenizer.from_file(str(imports / "artifacts" / name / "tokenizer.json"))


def generated(model: PreTrainedModel, ids: torch.Tensor, **options: Any) -> GenerateOutput | torch.LongTensor:
    """transformers' generate() on prompts without padding (an all-ones attention mask)."""
    from transformers import GenerationMixin

    assert isinstance(model, GenerationMixin), type(model).__name__  # each class these tests generate with
    return cast(Generative, model).generate(ids, attention_mask=torch.ones_like(ids), **options)


def generate(model: PreTrainedModel, ids: torch.Tensor, **options: Any) -> torch.Tensor:
    """The sequences of ``generated`` (without return_dict_in_generate): prompts and new tokens."""
    out = generated(model, ids, **options)
    assert isinstance(out, torch.Tensor), type(out).__name__
    return out


def serving_artifacts(serving: Serving, artifacts: Path) -> Serving:
    """`serving` with ``artifacts_dir`` set to ``artifacts`` unless the overrides name another."""

    def start(**overrides: Any) -> AbstractAsyncContextManager[Any]:
        return serving(**{"artifacts_dir": artifacts, **overrides})

    return start


async def served_translations(serving: Serving, name: str, sources: list[str], num_beams: int,
                              max_new_tokens: int, **options: Any) -> list[dict[str, Any]]:
    """/v1/translate of ``sources`` on ``name`` with the search transformers' generate() runs by default
    (no n-gram ban, length penalty 1): the translations, in order."""
    body = {"text": sources, "model": name, "num_beams": num_beams, "max_new_tokens": max_new_tokens,
            "no_repeat_ngram_size": 0, "length_penalty": 1.0, **options}
    async with serving(models=name) as s:
        r = await s.client.post("/v1/translate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == name
        translations: list[dict[str, Any]] = r.json()["translations"]
    return translations
