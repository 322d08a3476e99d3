"""The request limits that the settings and the loaded models set, written into the OpenAPI document so
that it calls valid only what the server takes: the new-token caps, the beam limit, the items one request
may queue, and the token ids and prompt lengths that the model's vocabulary and context allow.

What depends on tokenizing a text (a text's length in tokens, the attention budget) cannot be stated in
JSON Schema: the descriptions say so, and a 422 answers it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.kinds import EMBEDDING, GENERATION, TRANSLATION
from service.api.native.schemas import TOKEN_ID_DIGITS
from service.api.openai.chat import chat_models
from service.engine.engine import Engine
from service.engine.tasks.translation.request import DEFAULT_BEAMS, MAX_BEAMS

Schema = dict[str, Any]


def _arrays(prop: Schema) -> list[Schema]:
    """The array members of a property (itself, or within its anyOf)."""
    members = prop.get("anyOf", [prop])
    return [m for m in members if m.get("type") == "array"]


def _integers(prop: Schema) -> list[Schema]:
    members = prop.get("anyOf", [prop])
    return [m for m in members if m.get("type") == "integer"]


def _token_lists(prop: Schema) -> list[Schema]:
    """The members of a prompt that are one prompt as token ids: arrays of integers, at any depth."""
    found = []
    for array in _arrays(prop):
        items = array.get("items", {})
        if items.get("type") == "integer":
            found.append(array)
        elif items.get("type") == "array":
            found += _token_lists(items)
    return found


def _item_lists(prop: Schema) -> list[Schema]:
    """The members of a field that are many items (texts, prompts): arrays of anything but token ids."""
    return [a for a in _arrays(prop) if a.get("items", {}).get("type") != "integer"]


def _choice_branches(completions: Schema) -> list[Schema]:
    """The branches of openai_schemas.CHOICES_RULE in CompletionRequest, one per n."""
    for rule in completions.get("allOf", []):
        branches = rule.get("anyOf", [])
        if branches and all("n" in b.get("properties", {}) for b in branches):
            return list(branches)
    return []


def decimal_at_most(top: int, width: int = TOKEN_ID_DIGITS) -> str:
    """A regex for the decimal strings of 0..top with at most `width` digits, leading zeros allowed (as the
    server reads logit_bias keys with int())."""
    digits = str(top)
    parts = []
    for length in range(1, len(digits)):  # every number shorter than top
        first = "[0-9]" if length == 1 else "[1-9]"
        parts.append((first + "[0-9]" * (length - 1), length))
    for i, d in enumerate(digits):  # as long as top: below it at digit i, equal before
        low = 1 if i == 0 and len(digits) > 1 else 0
        if int(d) > low:
            rest = len(digits) - i - 1
            parts.append((digits[:i] + f"[{low}-{int(d) - 1}]" + "[0-9]" * rest, len(digits)))
    parts.append((digits, len(digits)))
    alternatives = [f"0{{0,{width - length}}}{body}" for body, length in parts if length <= width]
    return "^(?:" + "|".join(alternatives) + ")$"


def _per_model(
    component: Schema,
    values: dict[str, Any],
    default: str | None,
    direct: Callable[[Schema, Any], None],
    rule: Callable[[Any], Schema],
) -> None:
    """Each model's limit (`values`: model name -> limit) on the requests that choose it. Where every model
    has the same, `direct` writes it into the component's own properties; else one rule per model, `if
    model is name then rule(limit)` (an absent or null model chooses `default`)."""
    if len(set(values.values())) == 1:
        direct(component, next(iter(values.values())))
        return
    for name, value in values.items():
        chosen: Schema = {"properties": {"model": {"const": name}}, "required": ["model"]}
        if name == default:
            chosen = {"anyOf": [chosen, {"properties": {"model": {"type": "null"}}}]}
        component.setdefault("allOf", []).append({"if": chosen, "then": {"properties": rule(value)}})


def _bound_token_ids(field: str) -> tuple[Callable[[Schema, Any], None], Callable[[Any], Schema]]:
    """`direct` and `rule` for a field whose token-id lists take (vocabulary size, most ids)."""

    def direct(component: Schema, limit: tuple[int, int | None]) -> None:
        vocab, most = limit
        for ids in _token_lists(component["properties"][field]):
            ids["items"]["maximum"] = vocab - 1
            if most is not None:
                ids["maxItems"] = most

    def rule(limit: tuple[int, int | None]) -> Schema:
        vocab, most = limit
        ids: Schema = {"type": "array", "items": {"type": "integer", "maximum": vocab - 1}}
        if most is not None:
            ids["maxItems"] = most
        texts = {"type": "array", "items": {"not": {"type": ["integer", "array"]}}}
        return {field: {"anyOf": [{"not": {"type": "array"}}, texts, ids, {"type": "array", "items": ids}]}}

    return direct, rule


def _bound_logit_bias(component: Schema, vocab: int) -> None:
    for bias in component["properties"]["logit_bias"].get("anyOf", []):
        if bias.get("type") == "object":
            bias["propertyNames"] = {"pattern": decimal_at_most(vocab - 1)}


def _logit_bias_rule(vocab: int) -> Schema:
    return {"logit_bias": {"anyOf": [{"type": "null"}, {"propertyNames": {"pattern": decimal_at_most(vocab - 1)}}]}}


def _languages_rule(codes: tuple[str, ...]) -> Schema:
    """source_lang and target_lang: one of the model's codes, or null (a one-direction model: null only)."""
    allowed: Schema = {"enum": [*codes, None]} if codes else {"type": "null"}
    return {"source_lang": allowed, "target_lang": dict(allowed)}


def _bound_languages(component: Schema, codes: tuple[str, ...]) -> None:
    component.setdefault("properties", {}).update(_languages_rule(codes))


def _embedding_limits(components: dict[str, Schema], engine: Engine) -> None:
    """`dimensions`: the default embedder's size, or fewer where it was trained for them. Token ids: below its
    vocabulary, and at most its input limit unless the request may truncate (TEI's `truncate`)."""
    embedder = engine.default_model(EMBEDDING.name)
    if embedder is None:
        return
    size = embedder.dimensions
    for component in ("EmbeddingRequest", "EmbedRequest", "FeatureExtractionRequest", "FeatureExtractionOptions"):
        for member in _integers(components.get(component, {}).get("properties", {}).get("dimensions", {})):
            member["maximum"] = size
            if not embedder.artifact.dimensions_truncatable:
                member["minimum"] = size
    limit = (embedder.artifact.vocab_size, embedder.max_input_tokens)
    if "EmbeddingRequest" in components:  # no truncation in OpenAI's API
        _bound_token_ids("input")[0](components["EmbeddingRequest"], limit)
    embed = components.get("EmbedRequest")
    if embed is not None:
        _bound_token_ids("inputs")[0](embed, (limit[0], None))
        truncating = {"properties": {"truncate": {"const": True}}, "required": ["truncate"]}
        embed.setdefault("allOf", []).append(
            {"if": truncating, "else": {"properties": _bound_token_ids("inputs")[1](limit)}}
        )


def add_runtime_limits(schema: Schema, engine: Engine) -> None:
    components: dict[str, Schema] = schema.get("components", {}).get("schemas", {})
    _item_limits(components, engine)
    _embedding_limits(components, engine)
    _new_token_limits(components, engine)
    _beam_limits(components, engine)
    _per_model_limits(components, engine)


def _prop(components: dict[str, Schema], component: str, name: str) -> Schema | None:
    found: Schema | None = components.get(component, {}).get("properties", {}).get(name)
    return found


def _item_limits(components: dict[str, Schema], engine: Engine) -> None:
    """Items one request may queue (texts, prompts, and for completions prompts x n)."""
    most = engine.settings.max_queue_size
    for component, field in (("TranslateRequest", "text"), ("ClassifyRequest", "text"), ("CompletionRequest", "prompt"),
                             ("TranslationRequest", "inputs"), ("ClassificationRequest", "inputs"),
                             ("EmbeddingRequest", "input"), ("EmbedRequest", "inputs"), ("RerankRequest", "texts"),
                             ("FeatureExtractionRequest", "inputs"), ("RootTranslationRequest", "inputs"),
                             ("RootClassificationRequest", "inputs")):  # fmt: skip
        for array in _item_lists(_prop(components, component, field) or {}):
            array["maxItems"] = min(most, array.get("maxItems", most))  # the schema's own ceiling (MAX_ITEMS)
    for array in _arrays(_prop(components, "SimilarityInputs", "sentences") or {}):  # the source sentence is one more
        array["maxItems"] = min(most - 1, array.get("maxItems", most))
    for branch in _choice_branches(components.get("CompletionRequest") or {}):  # prompts x n <= the queue
        n = branch["properties"]["n"]["const"]
        if n > 1:
            branch["properties"]["prompt"] = {"anyOf": [{"not": {"type": "array"}}, {"items": {"type": "integer"}},
                                                        {"maxItems": most // n}]}  # fmt: skip


def _new_token_limits(components: dict[str, Schema], engine: Engine) -> None:
    """Translation refuses more new tokens than its cap (generation's budgets: below)."""
    caps = [m.max_target_tokens for m in engine.served().values() if m.max_target_tokens is not None]
    for component in ("TranslateRequest", "TranslationGenerateParameters"):
        for member in _integers(_prop(components, component, "max_new_tokens") or {}):
            if caps:
                member["maximum"] = min(caps)
    # A generation budget above SERVE_MAX_NEW_TOKENS is refused only where the context has room for more than
    # the cap after the prompt (beyond the context it is clamped): it depends on the prompt's tokens, so the
    # document states no maximum, and the 422 names SERVE_MAX_NEW_TOKENS.


def _beam_limits(components: dict[str, Schema], engine: Engine) -> None:
    """Beams are batch rows; n_best <= num_beams (DEFAULT_BEAMS when absent)."""
    beams = min(MAX_BEAMS, engine.settings.max_batch_size)
    for component in ("TranslateRequest", "TranslationGenerateParameters"):
        for member in _integers(_prop(components, component, "num_beams") or {}):
            member["maximum"] = beams
    translate = components.get("TranslateRequest")
    if translate is not None:  # one branch per num_beams (an absent one is DEFAULT_BEAMS), as CHOICES_RULE
        translate.setdefault("allOf", []).append({"anyOf": [
            {"properties": {"num_beams": {"const": k}, "n_best": {"maximum": k}},
             **({} if k == DEFAULT_BEAMS else {"required": ["num_beams"]})}
            for k in range(1, beams + 1)
        ]})  # fmt: skip


def _per_model_limits(components: dict[str, Schema], engine: Engine) -> None:
    """Limits that depend on the model a request names: language codes, token ids, logit bias keys."""
    by_name = engine.served()
    generators = {n: m for n, m in by_name.items() if m.task == GENERATION.name}
    translators = {n: m for n, m in by_name.items() if m.task == TRANSLATION.name}
    # Language codes: those of the chosen translator; none (null only) for a one-direction model.
    translate = components.get("TranslateRequest")
    if translate is not None and translators:
        codes = {n: tuple(t.artifact.languages) for n, t in translators.items()}
        _per_model(translate, codes, next(iter(translators)), _bound_languages, _languages_rule)
    # Token ids: below the chosen model's vocabulary, at most a prompt's worth (or SERVE_MAX_TOKENIZE_TOKENS).
    prompts = {n: (g.artifact.vocab_size, g.max_input_tokens) for n, g in generators.items()}
    for component in ("GenerateRequest", "CompletionRequest"):
        if component in components and prompts:
            _per_model(components[component], prompts, next(iter(generators)), *_bound_token_ids("prompt"))
    completions = components.get("CompletionRequest")
    if completions is not None and generators:
        vocabs = {n: g.artifact.vocab_size for n, g in generators.items()}
        _per_model(completions, vocabs, None, _bound_logit_bias, _logit_bias_rule)
    chat = components.get("ChatCompletionRequest")
    chatting = {n: generators[n].artifact.vocab_size for n in chat_models(engine) if n in generators}
    if chat is not None and chatting:  # an absent model (or a placeholder) is the first chat model
        _per_model(chat, chatting, next(iter(chatting)), _bound_logit_bias, _logit_bias_rule)
    if "DetokenizeRequest" in components and by_name:
        most = getattr(engine.settings, "max_tokenize_tokens", None)
        ids = {n: (s.artifact.vocab_size, most) for n, s in by_name.items()}
        _per_model(components["DetokenizeRequest"], ids, next(iter(by_name)), *_bound_token_ids("tokens"))
