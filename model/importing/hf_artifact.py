"""A Hugging Face checkpoint folder -> an artifact folder the server loads (graphs, config, tokenizer, card).

Import (model/importing/hf_import.py), measure parity against ``transformers`` where it is installed
(model/importing/hf_parity.py), export with our exporter, measure the exported graph, write the card.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from model.export.graphs import export_model
from model.importing.hf_chat_template import write_chat_template
from model.importing.hf_import import Imported, checked_config, import_checkpoint
from model.importing.hf_tokenizer import languages, load_tokenizer, special_tokens
from model.importing.quantized import card_rows, quantize_imported
from model.importing.sentence_transformers_folder import is_sentence_transformer, read_sentence_transformer
from model.network.embedder import Embedder
from model.training.card import count_parameters, use_sections

SOURCE_FILES = ("config.json", "modules.json", "sentence_bert_config.json", "tokenizer_config.json",
                "chat_template.jinja", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt",
                "vocab.json", "merges.txt", "sentencepiece.bpe.model", "source.spm", "target.spm", "README.md")


def checkpoint_license(folder: Path, given: str | None) -> str:
    """--license, else the model card's front matter (``license: apache-2.0``), else "unknown"."""
    if given:
        return given
    readme = folder / "README.md"
    if readme.is_file():
        match = re.search(r"^license:\s*(\S+)", readme.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match.group(1)
    return "unknown (no README.md license; pass --license)"


def torch_parity(result: Imported, folder: Path, tokenizer: Any, specials: dict[str, int]) -> dict[str, Any]:
    """Our fp32 PyTorch model vs transformers on a padded batch (before any fp16 rounding)."""
    try:
        from model.importing import hf_parity
    except ImportError as exc:  # transformers missing: the import still works, the card says so
        return {"checked": False, "why": f"transformers is not installed ({exc})"}
    headless = result.headless
    reference = hf_parity.load_hf_model(folder, result.family, has_head=not headless)
    inputs = hf_parity.reference_inputs(result.family, tokenizer, specials, hf_parity.SAMPLE_TEXTS)
    keep = hf_parity.real_positions(result.family, inputs)
    theirs = hf_parity.hf_logits(reference, result.family, inputs)
    ours = hf_parity.ours_logits(result.model, result.family, inputs, headless)
    return {
        "checked": True,
        "compared": "last hidden state (no head yet)" if headless else "logits",
        "batch": f"{len(hf_parity.SAMPLE_TEXTS)} padded sentences",
        "torch_fp32_max_abs_diff": hf_parity.max_abs_diff(ours, theirs, keep),
        "reference": reference,
        "inputs": inputs,
        "keep": keep,
        "headless": headless,
    }


def onnx_parity(parity: dict[str, Any], family: str, artifact: Path) -> dict[str, Any]:
    """The exported graph vs transformers: against the original fp32 weights, and against the same
    weights rounded as the graph stores them (fp16), which isolates the export itself."""
    summary = {k: v for k, v in parity.items() if k not in ("reference", "inputs", "keep", "headless")}
    pooling = json.loads((artifact / "config.json").read_text()).get("pooling")
    if not parity.get("checked") or (parity.get("headless") and pooling is None):  # a random head: nothing to compare
        return summary
    from model.importing import hf_parity

    inputs, keep, reference = parity["inputs"], parity["keep"], parity["reference"]

    def expected(model: Any) -> Any:
        if pooling is not None:  # an embedder: the reference's hidden states pooled the same way
            return hf_parity.hf_embeddings(model, inputs, pooling)
        return hf_parity.hf_logits(model, family, inputs)

    graph = hf_parity.onnx_logits(artifact, family, inputs)
    if pooling is not None:
        summary["compared"] = f"{pooling}-pooled embeddings (graph) and last hidden state (PyTorch)"
    summary["onnx_vs_fp32_max_abs_diff"] = hf_parity.max_abs_diff(graph, expected(reference), keep)
    if json.loads((artifact / "config.json").read_text())["export"]["weights_storage"] == "float16":
        summary["onnx_vs_fp16_rounded_max_abs_diff"] = hf_parity.max_abs_diff(
            graph, expected(hf_parity.fp16_rounded(reference)), keep)
    return summary


def write_card(out: Path, card: dict[str, Any]) -> None:
    (out / "card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n")
    lines = [f"# {card['model']}", "", card["summary"], "", "| | |", "|---|---|",
             f"| parameters | {card['parameters']:,} |", f"| weights from | {card['source']['origin']} |",
             f"| license | {card['source']['license']} |", f"| conversion | `{card['source']['command']}` |"]
    for key, value in card.get("parity", {}).items():
        lines.append(f"| parity: {key} | {value} |")
    for key, value in card.get("metrics", {}).items():
        lines.append(f"| {key} | {value} |")
    if card.get("quantization"):
        lines += card_rows(card["quantization"])
    lines += [f"| note | {note} |" for note in card.get("notes", [])]
    lines += use_sections(card)  # a card with an intended use (scripts/finetune_pretrained.py writes one)
    (out / "card.md").write_text("\n".join(lines) + "\n")


def checkpoint_origin(folder: Path) -> str:
    """The checkpoint imported: a Hugging Face cache snapshot's repository (``models--org--name``), else the
    folder's name. Not config.json's ``_name_or_path``: that is where the weights were loaded from before they
    were saved, for a fine-tuned checkpoint its base model (all-MiniLM-L6-v2's says
    nreimers/MiniLM-L6-H384-uncased)."""
    resolved = folder.resolve()
    for part in reversed(resolved.parts):
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    return resolved.name


def import_card(name: str, result: Imported, folder: Path, license_: str, command: str,
                parity: dict[str, Any]) -> dict[str, Any]:
    hf = result.hf_config
    origin = checkpoint_origin(folder)
    return {
        "model": name,
        "summary": f"{hf.get('model_type')} checkpoint ({', '.join(hf.get('architectures') or [])}) imported "
                   f"into our {result.kind} class and exported with our exporter.",
        "parameters": result.model.graph_parameters() if isinstance(result.model, Embedder)
        else count_parameters(result.model),
        "config": result.config,
        "source": {"origin": str(origin), "folder": str(folder), "model_type": hf.get("model_type"),
                   "architectures": hf.get("architectures"), "license": license_, "command": command,
                   "files": sorted(p.name for p in folder.iterdir() if p.name in SOURCE_FILES)},
        "parity": parity,
        "notes": result.notes,
        "metrics": {},
    }


def import_to_artifact(folder: Path, out: Path, name: str, labels: list[str] | None = None,
                       license_: str | None = None, int8: bool = True, command: str = "",
                       fp16_storage: bool = True, quantize: str | None = None,
                       kv_cache: str = "in-place") -> dict[str, Any]:
    """Import ``folder``, export it to ``out`` (served as ``name``) and write its card; returns the card.
    ``kv_cache``: a decoder's graph writes its cache "in-place" (no copy per step; no attention maps) or
    returns it "appended" (past + new, with attention maps).

    A sentence-transformers folder (modules.json) imports as an embedder pooled as its Pooling module says;
    ``labels`` asks for a random classification head on an encoder that has no trained one. ``quantize``
    ("int8", "int4") quantizes the exported graphs, which the card's cost is measured against."""
    embedding = None
    if is_sentence_transformer(folder):
        st = read_sentence_transformer(folder)
        embedding, checkpoint = st.options, st.transformer_dir
    else:
        checkpoint = folder
    hf, record, _ = checked_config(checkpoint)  # the sizes, before the tokenizer and the weights are read
    family = record.name
    tokenizer = load_tokenizer(checkpoint, family)
    specials = special_tokens(checkpoint, family, hf, tokenizer)
    result = import_checkpoint(checkpoint, specials, labels, embedding, languages(family, tokenizer))
    if embedding is not None:
        result.notes.append(f"sentence-transformers modules {', '.join(st.modules)}: {embedding.pooling} pooling, "
                            f"normalize {str(embedding.normalize).lower()}, max_seq_length {embedding.max_positions}")
    parity = torch_parity(result, checkpoint, tokenizer, specials)
    export_imported(result, tokenizer, out, name, int8 and not quantize, fp16_storage, kv_cache == "in-place")
    if result.chat and write_chat_template(checkpoint, out):  # chat needs the checkpoint's template
        result.notes.append("chat template from the checkpoint: POST /v1/chat/completions renders with it")
    card = import_card(name, result, folder, checkpoint_license(folder, license_), command,
                       onnx_parity(parity, family, out))
    if quantize:
        card["quantization"] = quantize_imported(out, quantize, fp16_storage, family, tokenizer, specials)
    write_card(out, card)
    return card


def export_imported(result: Imported, tokenizer: Any, out: Path, name: str, int8: bool,
                    fp16_storage: bool = True, in_place_cache: bool = True) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        tokenizer.save(str(path))
        export_model(result.kind, result.model, path, out, int8=int8, name=name, fp16_storage=fp16_storage,
                     in_place_cache=in_place_cache and result.kind == "generator")
