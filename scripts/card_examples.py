"""A card's ``out_of_domain_examples``: what the served model really answers to everyday inputs outside
its training domains (the probes of model/training/intended_use.py), asked through the server's own routes.

The app runs in-process (its real lifespan, start-up checks, routes and engine; httpx on the ASGI app,
no socket: scripts/served_app.py), and every request names only the model and the
input, so the answers are those of the server's defaults; the generator's requests add ``seed: 0``, so
its sampled answers can be asked again. The export calls ``refresh_card`` (scripts/export.py,
scripts/recipes/, scripts/finetune_pretrained.py), so a new model's card shows that model's answers;
``python -m scripts.card_examples`` does it for the committed artifacts.

    python -m scripts.card_examples                          # every model in artifacts/
    python -m scripts.card_examples translator --threads 2

Rewrites card.json and card.md of each artifact folder (nothing else: no graph, no golden.json) and
prints the answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.training.intended_use import Probe, record_for, with_intended_use

COMMAND = "python -m scripts.card_examples"


@dataclass(frozen=True)
class Route:
    """How the probes of one task are asked: the server's route, the request, and the answer shown."""

    path: str
    how: str  # the card's out_of_domain_examples_how, after "POST <path>"
    request: Callable[[str, str], dict[str, Any]]  # (model, input) -> the request body
    answer: Callable[[Any], str]  # the response body -> the answer on the card


def _label(response: Any) -> str:
    result = response["results"][0]
    return f"{result['label']} ({result['score']:.2f})"


ROUTES: dict[str, Route] = {  # one record per task whose models have probes
    "translation": Route(
        "/v1/translate", "with only the model and the text: the server's default request (beam search, no sampling)",
        lambda model, text: {"model": model, "text": text},
        lambda response: str(response["translations"][0]["text"]),
    ),
    "generation": Route(
        "/v1/generate", "with only the model, the prompt and seed 0: the server's default sampling and length; "
                        "the answer is the text generated after the prompt",
        lambda model, text: {"model": model, "prompt": text, "seed": 0},
        lambda response: str(response["text"]),
    ),
    "classification": Route(
        "/v1/classify", "with only the model and the text; the answer is the label and its probability",
        lambda model, text: {"model": model, "text": text},
        _label,
    ),
}


def how(route: Route) -> str:
    return (f"Real answers of the served model, asked by `{COMMAND}` through the server's own route: "
            f"POST {route.path} {route.how}.")


def route_of(folder: Path) -> Route:
    """The route of the task in ``folder``'s config.json."""
    return ROUTES[json.loads((folder / "config.json").read_text())["task"]]


async def _ask(client: Any, route: Route, name: str, text: str) -> str:
    r = await client.post(route.path, json=route.request(name, text))
    r.raise_for_status()
    return route.answer(r.json())


async def ask_served(folder: Path, route: Route, probes: tuple[Probe, ...], threads: int = 2) -> list[dict[str, str]]:
    """Each probe asked alone of the model in ``folder`` (served under the folder's name) through ``route``."""
    from scripts.served_app import served_client

    async with served_client("http://card-examples", 600, artifacts_dir=folder.parent, models=[folder.name],
                             intra_op_threads=threads, inter_op_threads=1, warmup=False) as client:
        return [{"input": p.input, "output": await _ask(client, route, folder.name, p.input), "note": p.note}
                for p in probes]


def write_any_card(folder: Path, card: dict[str, Any]) -> None:
    """card.json and card.md with the writer that made them: an imported checkpoint's card (it has a
    ``source``) with model/importing/hf_artifact.py's, ours with model/training/card.py's."""
    from model.importing.hf_artifact import write_card as write_imported_card
    from model.training.card import write_card as write_trained_card

    (write_imported_card if "source" in card else write_trained_card)(folder, card)


def with_examples(card: dict[str, Any], route: Route, examples: list[dict[str, str]]) -> dict[str, Any]:
    """``card`` with its examples (and how they were asked) right after ``out_of_scope``."""
    fields = {"out_of_domain_examples_how": how(route), "out_of_domain_examples": examples}
    out: dict[str, Any] = {}
    for key, value in card.items():
        if key not in fields:
            out[key] = value
        if key == "out_of_scope":
            out |= fields
    return out if "out_of_domain_examples" in out else out | fields


def refresh_card(folder: Path, threads: int = 2) -> dict[str, Any] | None:
    """Ask the served model of ``folder`` its probes and rewrite its card.json and card.md with the
    intended use and the answers. None (nothing written) for a card without a record (an untrained
    test export, an imported checkpoint of another name)."""
    card = json.loads((folder / "card.json").read_text())
    record = record_for(card)
    if record is None:
        return None
    route = route_of(folder)
    examples = asyncio.run(ask_served(folder, route, record.probes, threads))
    card = with_examples(with_intended_use(card), route, examples)
    write_any_card(folder, card)
    return card


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="artifact folder names (default: every one with a card)")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime threads")
    args = parser.parse_args()
    names = args.models or sorted(p.parent.name for p in args.artifacts.glob("*/config.json"))
    for name in names:
        card = refresh_card(args.artifacts / name, args.threads)
        if card is None:
            print(f"{name}: its card has no intended-use record (model/training/intended_use.py); left as it is")
            continue
        print(json.dumps({name: card["out_of_domain_examples"]}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
