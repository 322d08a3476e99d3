"""Measure a translator artifact the way users get it: through the server's own /v1/translate.

    python -m scripts.evaluate_translation artifacts            # the committed translator
    python -m scripts.evaluate_translation runs/translator/cooldown/export --limit 100
    python -m scripts.evaluate_translation artifacts --sets all                     # + every test_<source>
    python -m scripts.evaluate_translation artifacts --sets test_libreoffice,test_debian

The app runs in-process (its real lifespan, routes and engine; httpx on the ASGI app, no socket), so
the numbers are those of the exported graphs decoded by the server's code with its default settings:
"default" is a request that names nothing but the text. Prints a table and writes JSON (--out).
No torch needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import sacrebleu
from tokenizers import Tokenizer

TEST_SETS = {  # name -> file under data/translation/
    "valid": "valid.jsonl",
    "test_web": "test.jsonl",
    "test_bbe": "test_bbe.jsonl",
    "test_gettext": "test_gettext.jsonl",
}
ALL_SETS = "all"  # TEST_SETS plus every other test_*.jsonl in the data folder (per-source held-out sets)
DECODINGS: dict[str, dict[str, Any]] = {"default": {}, "greedy": {"num_beams": 1, "no_repeat_ngram_size": 0}}
TEXTS_PER_REQUEST = 16


def has_repeat_loop(tokens: list[int], max_span: int = 4, times: int = 3) -> bool:
    """True when some run of 1..max_span tokens occurs ``times`` times in a row ("de la de la de la")."""
    for span in range(1, max_span + 1):
        for start in range(len(tokens) - span * times + 1):
            unit = tokens[start : start + span]
            if all(tokens[start + k * span : start + (k + 1) * span] == unit for k in range(1, times)):
                return True
    return False


def set_file(name: str) -> str:
    """The file of a set: TEST_SETS' names, else ``<name>.jsonl`` for a ``test_<source>`` set."""
    if name in TEST_SETS:
        return TEST_SETS[name]
    if name.startswith("test_"):
        return f"{name}.jsonl"
    raise ValueError(f"unknown set {name!r}: one of {', '.join(TEST_SETS)}, test_<source> or {ALL_SETS}")


def resolve_sets(names: list[str], data_dir: Path) -> tuple[str, ...]:
    """Expand ``all`` into TEST_SETS plus every other ``test_*.jsonl`` present, sorted; keep the others."""
    known = set(TEST_SETS.values())
    extra = sorted(p.stem for p in data_dir.glob("test_*.jsonl") if p.name not in known)
    out: list[str] = []
    for name in names:
        for item in ([*TEST_SETS, *extra] if name == ALL_SETS else [name]):
            set_file(item)  # unknown names fail here, before the server starts
            if item not in out:
                out.append(item)
    return tuple(out)


def read_pairs(path: Path, limit: int | None) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:limit]


async def translate_all(client: httpx.AsyncClient, sources: list[str], decoding: dict[str, Any]) -> list[str]:
    """Every source, TEXTS_PER_REQUEST per request, four requests in flight (the server batches them)."""
    chunks = [sources[i : i + TEXTS_PER_REQUEST] for i in range(0, len(sources), TEXTS_PER_REQUEST)]
    gate = asyncio.Semaphore(4)

    async def one(chunk: list[str]) -> list[str]:
        async with gate:
            response = await client.post("/v1/translate", json={"text": chunk, **decoding})
            response.raise_for_status()
            return [t["text"] for t in response.json()["translations"]]

    results = await asyncio.gather(*(one(chunk) for chunk in chunks))
    return [text for chunk in results for text in chunk]


def score(hypotheses: list[str], rows: list[dict[str, str]], tokenizer: Tokenizer) -> dict[str, Any]:
    references = [r["tgt"] for r in rows]
    loops = sum(has_repeat_loop(e.ids) for e in tokenizer.encode_batch(hypotheses, add_special_tokens=False))
    return {
        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
        "repeat_loop_rate": round(loops / max(1, len(rows)), 4),
        "sentences": len(rows),
        "examples": [{"src": r["src"], "ref": r["tgt"], "hyp": h}
                     for r, h in list(zip(rows, hypotheses, strict=False))[:3]],
    }


async def evaluate(artifacts_dir: Path, data_dir: Path, limit: int | None = None, threads: int = 2,
                   sets: tuple[str, ...] = tuple(TEST_SETS)) -> dict[str, Any]:
    """{set: {decoding: metrics}} plus the server's default request, measured through /v1/translate."""
    from scripts.served_app import served_client

    tokenizer = Tokenizer.from_file(str(artifacts_dir / "translator" / "tokenizer.json"))
    results: dict[str, Any] = {}
    async with served_client("http://evaluate", 3600, artifacts_dir=artifacts_dir, models=["translator"],
                             intra_op_threads=threads, inter_op_threads=1, warmup=False,
                             request_timeout_s=3600, max_queue_size=100_000) as client:
        for name in sets:
            rows = read_pairs(data_dir / set_file(name), limit)
            results[name] = {}
            for decoding, fields in DECODINGS.items():
                hypotheses = await translate_all(client, [r["src"] for r in rows], fields)
                results[name][decoding] = score(hypotheses, rows, tokenizer)
    return results


def print_table(results: dict[str, Any]) -> None:
    width = max([14] + [len(name) + 2 for name in results])  # 14 for the default sets
    print(f"{'set':<{width}}{'decoding':<10}{'BLEU':>7}{'chrF':>7}{'loops':>8}{'n':>6}")
    for name, by_decoding in results.items():
        for decoding, m in by_decoding.items():
            print(f"{name:<{width}}{decoding:<10}{m['bleu']:>7.2f}{m['chrf']:>7.2f}{m['repeat_loop_rate']:>8.1%}"
                  f"{m['sentences']:>6}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", type=Path, help="a folder holding translator/ (as SERVE_ARTIFACTS_DIR)")
    parser.add_argument("--data", type=Path, default=Path("data/translation"))
    parser.add_argument("--limit", type=int, default=None, help="the first N pairs of each set")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    parser.add_argument("--sets", default=",".join(TEST_SETS),
                        help=f"any of {', '.join(TEST_SETS)}, test_<source> (a test_<source>.jsonl in --data) "
                             f"or {ALL_SETS} (those and every test_*.jsonl present)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    sets = resolve_sets(args.sets.split(","), args.data)
    results = asyncio.run(evaluate(args.artifacts, args.data, args.limit, args.threads, sets))
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
