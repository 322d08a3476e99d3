"""The Hugging Face families the importer reads, one module each (config mapping, weight mapping, special
tokens, parity reference): the encoders (classification head too), GPT-2 and the Llama-shaped decoders, and
the encoder-decoder translators. Adding one: a module with a ``FAMILY`` record (or ``FAMILIES``) and its line
below."""

from __future__ import annotations

from model.families import bert, distilbert, fairseq, gpt2, llama, m2m100, roberta, t5, xlm_roberta
from model.families.base import DecoderFamily, EncoderFamily, Seq2SeqFamily

ENCODER_FAMILIES: dict[str, EncoderFamily] = {
    f.name: f for f in (bert.FAMILY, roberta.FAMILY, xlm_roberta.FAMILY, distilbert.FAMILY)
}
DECODER_FAMILIES: dict[str, DecoderFamily] = {f.name: f for f in (gpt2.FAMILY, *llama.FAMILIES)}
SEQ2SEQ_FAMILIES: dict[str, Seq2SeqFamily] = {f.name: f for f in (*fairseq.FAMILIES, t5.FAMILY, m2m100.FAMILY)}
