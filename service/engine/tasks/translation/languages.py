"""A multilingual translator's language fields (M2M100, NLLB): codes -> tokens, and the source wrapped as the
checkpoint's tokenizer wraps it (the source language token first, the end token last)."""

from __future__ import annotations

from dataclasses import dataclass

from service.engine.errors import InvalidInput


@dataclass(frozen=True)
class Languages:
    codes: dict[str, int]  # code -> token id ("fr" for M2M100's __fr__, "fra_Latn" for NLLB)
    default_target: int | None  # the checkpoint's forced_bos_token_id
    eos: int

    def token(self, code: str, field: str) -> int:
        """The code's token; M2M100's ``__fr__`` spelling is accepted beside ``fr``."""
        if not self.codes:
            raise InvalidInput("this model is not multilingual: it translates one direction, leave it out", field)
        found = self.codes.get(code.removeprefix("__").removesuffix("__"))
        if found is None:
            shown = ", ".join(list(self.codes)[:20]) + (", ..." if len(self.codes) > 20 else "")
            raise InvalidInput(f"unknown language code {code!r}; this model's codes: {shown}", field)
        return found

    def target(self, code: str | None) -> int | None:
        """The token forced first in every translation (None: a one-direction model)."""
        if code is not None:
            return self.token(code, "target_lang")
        if self.codes and self.default_target is None:
            raise InvalidInput("this model is multilingual and has no default target language: name one", "target_lang")
        return self.default_target

    def source(self, ids: list[int], code: str | None) -> list[int]:
        """The tokenizer's ids with their language token replaced by ``code``'s (left as they are without one)."""
        if code is None:
            return ids
        token, language_tokens = self.token(code, "source_lang"), set(self.codes.values())
        body = [t for t in ids if t not in language_tokens and t != self.eos]
        return [token, *body, self.eos]
