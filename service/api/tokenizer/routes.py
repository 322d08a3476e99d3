"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize, GET /tokenizer_info (evaluation harnesses
such as lm-evaluation-harness use them as a remote tokenizer). `model` is optional: the generator by default."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Request as HttpRequest
from fastapi import Response as HttpResponse
from pydantic import ConfigDict, Field
from starlette.applications import Starlette

from service.api.asgi.lean_route import LeanRoute
from service.api.asgi.worker_slots import WorkerSlots
from service.api.deps import EngineDep
from service.api.errors import ApiError
from service.api.native.schemas import NonEmptyText, Request, Response, bounded
from service.api.responses import JSONBytes
from service.engine.token_count import count_past

router = APIRouter(tags=["tokenizer"], route_class=LeanRoute)

# A 1 MB prompt takes ~0.5 s to tokenize: on worker threads (encode_batch and decode_batch release the GIL,
# encode and decode do not), two at a time (the container's 2 cores), a bounded number waiting. The
# inference routes' long prompts use the same slots (service/engine/task_service.py).
TOKENIZER_WORKERS = 2
TOKENIZER_WAITING = 32
# Past this many characters (or a quarter as many tokens) the heap goes back to the OS once the tokenizer
# work is done (malloc_trim): else a burst of large inputs leaves the process that much bigger.
LARGE_INPUT_CHARS = 65_536


def tokenizer_slots(app: Starlette) -> WorkerSlots:
    """The app's slots for tokenizer work, made on its first use."""
    state = app.state
    if getattr(state, "tokenizer_slots", None) is None:
        state.tokenizer_slots = WorkerSlots(TOKENIZER_WORKERS, TOKENIZER_WAITING, "tokenizer work")
    slots: WorkerSlots = state.tokenizer_slots
    return slots


def too_many_tokens(count: int, limit: int, field: str) -> ApiError:
    return ApiError(
        422, "validation_error", f"{count:,} tokens; the limit is {limit:,} (SERVE_MAX_TOKENIZE_TOKENS)", field
    )


class TokenizeRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"prompt": "In the beginning", "model": "generator", "return_token_strs": True}]
        }
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
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], bounded(None, None)]


class DetokenizeResponse(Response):
    prompt: str


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, engine: EngineDep, request: HttpRequest) -> HttpResponse:
    service = engine.resolve(body.model)
    limit = request.app.state.settings.max_tokenize_tokens

    def work() -> bytes:  # on a worker thread: tokenizing, the lists and their JSON; the Encoding dies here too
        if len(body.prompt) > LARGE_INPUT_CHARS and (past := count_past(service.tokenizer, body.prompt, limit)):
            raise too_many_tokens(past, limit, "prompt")
        [encoding] = service.tokenizer.encode_batch([body.prompt], add_special_tokens=body.add_special_tokens)
        count = len(encoding)
        if count > limit:
            del encoding  # freed now, not kept by the refusal's traceback until the heap is trimmed
            raise too_many_tokens(count, limit, "prompt")
        answer = TokenizeResponse(
            count=count,
            max_model_len=service.artifact.max_positions,
            tokens=encoding.ids,
            token_strs=encoding.tokens if body.return_token_strs else None,
        )
        return answer.model_dump_json().encode()

    return JSONBytes(await tokenizer_slots(request.app).run(work, large=len(body.prompt) > LARGE_INPUT_CHARS))


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, engine: EngineDep, request: HttpRequest) -> DetokenizeResponse:
    service = engine.resolve(body.model)
    limit = request.app.state.settings.max_tokenize_tokens
    if len(body.tokens) > limit:
        raise too_many_tokens(len(body.tokens), limit, "tokens")
    vocab = service.artifact.vocab_size
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise ApiError(
            422, "validation_error", f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})", "tokens"
        )
    tokenizer = service.tokenizer
    large = len(body.tokens) > LARGE_INPUT_CHARS // 4
    [text] = await tokenizer_slots(request.app).run(lambda: tokenizer.decode_batch([body.tokens]), large=large)
    return DetokenizeResponse(prompt=text)


@router.get("/tokenizer_info")
async def tokenizer_info(engine: EngineDep, model: Annotated[str | None, Query()] = None) -> dict[str, Any]:
    """The tokenizer's configuration, in the keys of a Hugging Face `tokenizer_config.json` (as vLLM)."""
    service = engine.resolve(model)
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
