"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize, GET /tokenizer_info (evaluation harnesses
such as lm-evaluation-harness use them as a remote tokenizer). `model` is optional: the generator by default."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import ConfigDict, Field

from service.api.deps import EngineDep
from service.api.errors import ApiError
from service.api.schemas import NonEmptyText, Request, Response
from service.api.served import service_named

router = APIRouter(tags=["tokenizer"])


class TokenizeRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"prompt": "In the beginning", "model": "generator", "return_token_strs": True}]}
    )

    model: str | None = None
    prompt: NonEmptyText
    add_special_tokens: bool = Field(True, description="the classifier's [CLS]/[SEP]; the generator adds none")
    return_token_strs: bool = False


class TokenizeResponse(Response):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"tokens": [42, 79, 261, 2787], "model": "generator"}]})

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(Response):
    prompt: str


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, engine: EngineDep) -> TokenizeResponse:
    service = service_named(engine, body.model)
    encoding = service.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return TokenizeResponse(
        count=len(encoding.ids),
        max_model_len=service.artifact.max_positions,
        tokens=encoding.ids,
        token_strs=encoding.tokens if body.return_token_strs else None,
    )


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, engine: EngineDep) -> DetokenizeResponse:
    service = service_named(engine, body.model)
    vocab = service.artifact.vocab_size
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise ApiError(422, "validation_error", f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})", "tokens")
    return DetokenizeResponse(prompt=service.tokenizer.decode(body.tokens))


@router.get("/tokenizer_info")
async def tokenizer_info(engine: EngineDep, model: Annotated[str | None, Query()] = None) -> dict[str, Any]:
    """The tokenizer's configuration, in the keys of a Hugging Face `tokenizer_config.json` (as vLLM)."""
    service = service_named(engine, model)
    a = service.artifact
    names = {role: service.tokenizer.id_to_token(i) for role, i in a.special_tokens.items()}
    return {
        "model": service.name,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": a.max_positions,
        "vocab_size": a.vocab_size,
        "eos_token": names.get("eos") or names.get("sep"),
        "bos_token": names.get("bos") or names.get("cls"),
        "pad_token": names.get("pad"),
        "unk_token": names.get("unk"),
        "special_tokens": {role: {"id": a.special_tokens[role], "text": text} for role, text in names.items()},
        "chat_template": None,
    }
