"""What each served model is for: its intended use, the domains it was trained on, what it is not for,
and the everyday inputs outside those domains that its card shows real answers to.

One record per served model name (the artifact folder). model/training/card.py's ``write_card`` (our recipes)
and scripts/finetune_pretrained.py (the imported classifier) write the record into card.json
(``intended_use``, ``domains``, ``out_of_scope``); scripts/card_examples.py runs the probes through the
server's own routes and writes their answers as ``out_of_domain_examples`` (the export calls it, and
``python -m scripts.card_examples`` does it for the committed artifacts). The server's /v1/models
``summary`` is made from ``intended_use`` and ``domains`` (contract/cards.py).

A probe's note says why the input is outside the training domains and what a person would answer;
it never describes the model's answer, which changes with every training run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Probe:
    input: str
    note: str


@dataclass(frozen=True)
class IntendedUse:
    intended_use: str  # a phrase: "<use>; trained on <domains>." is the one-line summary
    domains: tuple[str, ...]  # short, for that line; card.json's data.description has the details
    out_of_scope: tuple[str, ...]
    probes: tuple[Probe, ...]


TRANSLATOR_PROBES = (
    Probe("Where is the train station?", "everyday travel phrase; a person would write: Où est la gare ?"),
    Probe("How much does this cost?", "shopping phrase; a person would write: Combien ça coûte ?"),
    Probe("I would like a coffee, please.",
          "café order; a person would write: Je voudrais un café, s'il vous plaît."),
    Probe("My phone battery is dead.",
          "modern everyday vocabulary; a person would write: La batterie de mon téléphone est à plat."),
    Probe("The meeting has been moved to Monday morning.",
          "office email; a person would write: La réunion a été déplacée à lundi matin."),
)

GENERATOR_PROBES = (
    Probe("My favourite recipe for chocolate cake is", "a recipe, not a political speech"),
    Probe("The football match last night was", "a sports chat, not a political speech"),
)

SENTIMENT_PROBES = (
    Probe("The battery died after two days and the seller never answered my emails.",
          "product review, not a movie review; a person reads it as negative"),
    Probe("Comfortable headphones, great sound for the price.",
          "product review, not a movie review; a person reads it as positive"),
    Probe("Oh great, my flight is delayed again. Just what I needed.",
          "sarcasm about travel; a person reads it as negative"),
    Probe("Ce film était absolument magnifique.", "French (the model was trained on English); means "
                                                   "'This film was absolutely magnificent': positive"),
    Probe("Das Essen war kalt und der Kellner unfreundlich.",
          "German (the model was trained on English); means 'The food was cold and the waiter unfriendly': negative"),
)

SENTIMENT_OUT_OF_SCOPE = (
    "neutral or mixed text: there is no neutral label, every input gets negative or positive",
    "sarcasm and irony",
    "other domains than movie reviews (products, services, social media): expect lower accuracy",
    "languages other than English",
    "decisions about people (moderation, hiring, credit)",
)

RECORDS: dict[str, IntendedUse] = {
    "translator": IntendedUse(
        intended_use="English -> French translation of short sentences in the style of Bible verses and "
                     "software interface strings; a model trained from scratch for demonstration, not a "
                     "general-purpose translator",
        domains=("Bible verses (English -> Louis Segond 1910 French)",
                 "software UI strings and help texts (the French gettext catalogs of Debian packages: system "
                 "tools, LibreOffice, desktop applications, two games)"),
        out_of_scope=(
            "everyday conversation, travel, shopping, news: words outside Bible and UI vocabulary come back "
            "invented, dropped or replaced by a Bible or UI word",
            "other language pairs, French -> English included",
            "long documents (trained on single sentences and strings)",
            "any use where a wrong translation matters (legal, medical, safety)",
        ),
        probes=TRANSLATOR_PROBES,
    ),
    "generator": IntendedUse(
        intended_use="continuing English text in the style of US presidential State of the Union addresses; "
                     "a small language model trained from scratch for demonstration",
        domains=("US State of the Union addresses, 1790-2021",),
        out_of_scope=(
            "facts: it invents names, numbers, dates and events",
            "instructions, questions and chat: it only continues the prompt",
            "other genres (stories, recipes, sports, code): prompts are pulled back into the speeches' register",
            "anything published as if a person or a president said it",
        ),
        probes=GENERATOR_PROBES,
    ),
    "classifier": IntendedUse(
        intended_use="negative/positive sentiment of short English movie-review sentences; a small BERT "
                     "trained from scratch for demonstration",
        domains=("English movie-review sentences (sentiment labels)",
                 "unlabeled English reviews, tweets, editorials, movie dialogs, BBC news and State of the "
                 "Union addresses (pretraining)"),
        out_of_scope=SENTIMENT_OUT_OF_SCOPE,
        probes=SENTIMENT_PROBES,
    ),
    "classifier-minilm": IntendedUse(
        intended_use="negative/positive sentiment of short English movie-review sentences; "
                     "sentence-transformers' all-MiniLM-L6-v2 fine-tuned for it",
        domains=("English movie-review sentences (sentiment labels)",
                 "all-MiniLM-L6-v2's own training: about a billion English sentence pairs (Reddit, "
                 "question-answer sites, scientific papers and others) on a MiniLM pretrained on general English"),
        out_of_scope=SENTIMENT_OUT_OF_SCOPE,
        probes=SENTIMENT_PROBES,
    ),
}


def record_for(card: dict[str, Any]) -> IntendedUse | None:
    """The record of a trained model's card; None for an untrained test export or a model without one."""
    if card.get("note") == "untrained":
        return None
    return RECORDS.get(str(card.get("model")))


def with_intended_use(card: dict[str, Any]) -> dict[str, Any]:
    """``card`` with its record's intended_use, domains and out_of_scope (unchanged when it has none).

    The fields go right after ``summary``; out_of_domain_examples, when the card has them, are kept."""
    record = record_for(card)
    if record is None:
        return card
    fields = {"intended_use": record.intended_use, "domains": list(record.domains),
              "out_of_scope": list(record.out_of_scope)}
    out: dict[str, Any] = {}
    for key, value in card.items():
        if key in fields:
            continue
        out[key] = value
        if key == "summary":
            out |= fields
    return out if "intended_use" in out else out | fields
