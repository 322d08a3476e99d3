"""The Hugging Face families the importer reads, one module each (config mapping, weight mapping, special
tokens, parity reference): the encoders (classification head too) and the Llama-shaped decoders. Adding one:
a module with a ``FAMILY`` record (or ``FAMILIES``) and its line below."""

from __future__ import annotations

from model.families import bert, distilbert, llama, roberta, xlm_roberta
from model.families.base import DecoderFamily, EncoderFamily

ENCODER_FAMILIES: dict[str, EncoderFamily] = {
    f.name: f for f in (bert.FAMILY, roberta.FAMILY, xlm_roberta.FAMILY, distilbert.FAMILY)
}
DECODER_FAMILIES: dict[str, DecoderFamily] = {f.name: f for f in llama.FAMILIES}
