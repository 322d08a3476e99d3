"""config.json's `chat_template` entry: the Jinja chat template an imported checkpoint came with, in a file
beside config.json, and the special tokens the template may name (`bos_token`, `eos_token`, ...).

    "chat_template": {"file": "chat_template.jinja", "special_tokens": {"bos_token": "<s>", "eos_token": "</s>"}}

Artifacts without the entry (our own generator) have no template: chat requests to them are refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.names import CHAT_TEMPLATE_TOKENS

CHAT_TEMPLATE = "chat_template"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True)
class ChatTemplateSpec:
    source: str  # the Jinja text
    file: Path
    special_tokens: dict[str, str] = field(default_factory=dict)  # template variable -> token text


def parse_chat_template(folder: Path, data: Any, where: str) -> ChatTemplateSpec:
    """The entry's template and tokens; ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {CHAT_TEMPLATE} must be an object")
    name = data.get("file", CHAT_TEMPLATE_FILE)
    if not isinstance(name, str):
        raise ValueError(f"{where}: {CHAT_TEMPLATE}.file must be a string")
    path = folder / name
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read the chat template {path} ({exc})") from None
    tokens = data.get("special_tokens", {})
    # Only these names: another (`messages`, say) would shadow the render's own variables.
    if not isinstance(tokens, dict) or not all(
        k in CHAT_TEMPLATE_TOKENS and isinstance(v, str) for k, v in tokens.items()
    ):
        raise ValueError(
            f"{where}: {CHAT_TEMPLATE}.special_tokens must map names among "
            f"{', '.join(CHAT_TEMPLATE_TOKENS)} to token strings"
        )
    return ChatTemplateSpec(source, path, dict(tokens))
