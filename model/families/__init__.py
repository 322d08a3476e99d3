"""The Hugging Face families the importer reads, one module each (config mapping, weight mapping, special
tokens, parity reference): the encoders (classification head too), GPT-2 and the Llama-shaped decoders, and
the encoder-decoder translators. Each module's ``FAMILY`` (or ``FAMILIES``) is a record of one of the shapes in
model/families/shapes.py. Adding a family: its module and its name in the line below."""

from __future__ import annotations

from model.families import bert, distilbert, fairseq, gpt2, llama, m2m100, roberta, t5, xlm_roberta
from model.families.shapes import Family

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (bert.FAMILY, roberta.FAMILY, xlm_roberta.FAMILY, distilbert.FAMILY, gpt2.FAMILY, *llama.FAMILIES,
              *fairseq.FAMILIES, t5.FAMILY, m2m100.FAMILY)
}
