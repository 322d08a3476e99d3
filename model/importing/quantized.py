"""An imported artifact quantized (``--quantize int8|int4``: model/export/quantize.py) and what that costs,
measured against the fp32 graphs it was made from, for the card.

Every task: the parity batch (hf_parity.SAMPLE_TEXTS) through both artifacts, the share of positions whose
top-1 (token, class) is the same and the largest logit difference; an embedder's cosine between the two
embeddings instead. A decoder also: the perplexity of both on HELD_OUT, a passage written for this check
(so no checkpoint has seen it), relative to fp32.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from model.export.quantize import quantize_artifact
from model.families import FAMILIES
from model.families.shapes import DecoderFamily
from model.importing import hf_parity

HELD_OUT = (
    "The library on the corner of our street opens at nine and closes late on Thursdays. Most mornings a "
    "small queue waits outside: students with laptops, a man who reads every newspaper from the first page "
    "to the last, and parents with children who want the picture books near the window. The building is "
    "older than anyone who works there, and the heating makes a knocking sound in winter. Last year the town "
    "council asked whether it should be sold. People wrote letters, filled a meeting hall and explained what "
    "the place meant to them. Some spoke about quiet, some about the internet they could not afford at home, "
    "and one woman said that she had learned to read there at the age of forty. The council kept the "
    "library open and promised to repair the roof before the next winter. The repairs began in the spring, "
    "and for a few weeks the books on the top floor were moved into the hall downstairs."
)


def decoder_nll(session: ort.InferenceSession, config: dict[str, Any], ids: np.ndarray,
                window: int) -> tuple[float, int]:
    """Negative log-likelihood (sum, tokens) of a token stream under a decoder graph, in windows of
    ``window`` positions from an empty cache; each window predicts its own next tokens. The graph is fed as
    the parity check feeds a decoder (DecoderFamily.graph_output: it depends on the graph's contract only)."""
    family = next(f for f in FAMILIES.values() if isinstance(f, DecoderFamily))
    names = [o.name for o in session.get_outputs()]

    def run(role: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = torch.as_tensor(ids[start : start + window + 1])[None]
        n = chunk.shape[1] - 1
        inputs = {"input_ids": chunk[:, :-1], "attention_mask": torch.ones(1, n, dtype=torch.long),
                  "position_ids": torch.arange(n)[None]}
        logits = family.graph_output(run, config, inputs)[0].astype(np.float64)
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        nll -= float(log_probs[np.arange(n), chunk[0, 1:].numpy()].sum())
        count += n
    return nll, count


def held_out_perplexity(artifact: Path, tokenizer: Tokenizer) -> tuple[float, int]:
    """(perplexity, tokens predicted) of HELD_OUT under the artifact's decoder, within its context."""
    config = json.loads((artifact / "config.json").read_text())
    ids = np.array(tokenizer.encode(HELD_OUT).ids[: config["max_positions"]], dtype=np.int64)
    nll, count = decoder_nll(hf_parity.session(artifact / config["graphs"]["decoder"]["file"]), config, ids, len(ids))
    return math.exp(nll / count), count


def sample_agreement(reference: Path, quantized: Path, family: str, tokenizer: Tokenizer,
                     specials: dict[str, int]) -> dict[str, Any]:
    """The parity batch through both artifacts: top-1 agreement and the largest logit difference, or the
    lowest cosine between an embedder's two embeddings."""
    inputs = hf_parity.reference_inputs(family, tokenizer, specials, hf_parity.SAMPLE_TEXTS)
    ours, theirs = (hf_parity.onnx_logits(a, family, inputs) for a in (quantized, reference))
    if json.loads((reference / "config.json").read_text()).get("pooling") is not None:  # embeddings [B, D]
        cosine = (ours * theirs).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1))
        return {"min_cosine_vs_fp32": round(float(cosine.min()), 5), "sentences": len(cosine)}
    keep = hf_parity.real_positions(family, inputs).numpy() if ours.ndim == 3 else np.ones(len(ours), bool)
    same = ours.argmax(-1) == theirs.argmax(-1)
    return {"top1_agreement_vs_fp32": round(float(same[keep].mean()), 4), "positions": int(keep.sum()),
            "max_abs_logit_diff": round(hf_parity.max_abs_diff(ours, theirs, torch.as_tensor(keep)
                                                               if ours.ndim == 3 else None), 4)}


def quantization_cost(reference: Path, quantized: Path, family: str, tokenizer: Tokenizer,
                      specials: dict[str, int]) -> dict[str, Any]:
    cost = {"sample_batch": sample_agreement(reference, quantized, family, tokenizer, specials)}
    if isinstance(FAMILIES[family], DecoderFamily):
        (fp32, tokens), (ppl, _) = (held_out_perplexity(a, tokenizer) for a in (reference, quantized))
        cost["held_out_perplexity"] = {"fp32": round(fp32, 3), "quantized": round(ppl, 3),
                                       "change": f"{ppl / fp32 - 1:+.2%}", "tokens": tokens}
    return cost


def quantize_imported(out: Path, precision: str, fp16_storage: bool, family: str, tokenizer: Tokenizer,
                      specials: dict[str, int]) -> dict[str, Any]:
    """Quantize the fp32 artifact in ``out`` in place; returns config.json's record with the measured cost."""
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / out.name
        shutil.copytree(out, reference)
        record = quantize_artifact(out, precision, fp16_storage)
        return record | {"cost": quantization_cost(reference, out, family, tokenizer, specials)}


def card_rows(quantization: dict[str, Any]) -> list[str]:
    """card.md's lines for a quantized artifact: the precision and what it costs against fp32."""
    q, cost = quantization, quantization["cost"]
    rows = [f"| precision | {q['precision']} weights (ONNX Runtime MatMulNBits: {q['bits']}-bit blocks of "
            f"{q['block_size']}, symmetric, accuracy level {q['accuracy_level']}); the parity rows are the float "
            "export's |"]
    if "held_out_perplexity" in cost:
        p = cost["held_out_perplexity"]
        rows.append(f"| quantization cost: perplexity | {p['quantized']} against {p['fp32']} in fp32 ({p['change']}) "
                    f"on a {p['tokens']}-token held-out passage |")
    batch = cost["sample_batch"]
    if "min_cosine_vs_fp32" in batch:
        rows.append(f"| quantization cost: embeddings | cosine with fp32 at least {batch['min_cosine_vs_fp32']} "
                    f"({batch['sentences']} sentences) |")
    else:
        rows.append(f"| quantization cost: top-1 | the same as fp32 at {batch['top1_agreement_vs_fp32']:.1%} of "
                    f"{batch['positions']} positions; largest logit difference {batch['max_abs_logit_diff']} |")
    return rows
