"""A checkpoint's chat template, carried into the artifact so the server can render chat requests.

Found where ``transformers`` looks: ``chat_template.jinja`` beside the tokenizer, else ``tokenizer_config.json``'s
``chat_template`` (a string, or a list of named templates, of which "default" is the one used without a
name). It is written to ``chat_template.jinja`` in the artifact, and config.json's ``chat_template`` entry
names the file and the special tokens the template can use (``bos_token``, ``eos_token``, ... as text), the
variables ``apply_chat_template`` passes (service/runtime/chat_template_spec.py reads it back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.names import CHAT_TEMPLATE_TOKENS
from model.families.base import CheckpointError

TEMPLATE_FILE = "chat_template.jinja"


def _json_file(path: Path) -> dict[str, Any]:
    """A JSON object from the checkpoint ({} when the file is absent); a broken file is a CheckpointError."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read it ({exc})") from None
    return data if isinstance(data, dict) else {}


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    return _json_file(folder / "tokenizer_config.json")


def find_chat_template(folder: Path) -> str | None:
    """The checkpoint's template text, or None when it has none."""
    file = folder / TEMPLATE_FILE
    if file.is_file():
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{file}: cannot read it ({exc})") from None
    where = folder / "tokenizer_config.json"
    template = _tokenizer_config(folder).get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
        raise CheckpointError(f"{where}: chat_template lists {sorted(map(str, named))} but no 'default' template")
    raise CheckpointError(f"{where}: chat_template must be a string or a list of named templates")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def template_tokens(folder: Path) -> dict[str, str]:
    """The named special tokens as text, from tokenizer_config.json, else special_tokens_map.json."""
    config = _tokenizer_config(folder)
    mapped = _json_file(folder / "special_tokens_map.json")
    tokens = {}
    for name in CHAT_TEMPLATE_TOKENS:
        text = _token_text(config.get(name)) or _token_text(mapped.get(name))
        if text is not None:
            tokens[name] = text
    return tokens


def write_chat_template(checkpoint: Path, artifact: Path) -> bool:
    """Copy the checkpoint's template into the exported artifact and record it in its config.json; False
    (nothing written) when the checkpoint has none."""
    template = find_chat_template(checkpoint)
    if template is None:
        return False
    (artifact / TEMPLATE_FILE).write_text(template, encoding="utf-8")
    config_path = artifact / "config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = {"file": TEMPLATE_FILE, "special_tokens": template_tokens(checkpoint)}
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return True
