"""The Hugging Face encoder families the importer reads, one module each (config mapping, weight mapping,
classification head, special tokens, parity reference). Adding one: a module with a ``FAMILY`` record and
its line below."""

from __future__ import annotations

from model.families import bert, distilbert, roberta, xlm_roberta
from model.families.base import EncoderFamily

ENCODER_FAMILIES: dict[str, EncoderFamily] = {
    f.name: f for f in (bert.FAMILY, roberta.FAMILY, xlm_roberta.FAMILY, distilbert.FAMILY)
}
