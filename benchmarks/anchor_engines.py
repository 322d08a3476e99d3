"""The engines benchmarks/anchor.py compares ours with: CTranslate2 and Hugging Face eager, same shapes.

    python -m benchmarks.anchor_engines ct2|hf|engine generator|generator-int8|translator|classifier|embedder|llama \
        --artifacts DIR --work DIR [--threads 2] [shape options]


builds nothing: it loads the models that `build_hf_and_ct2` saved in --work (or, for `engine`, our
served artifacts in --artifacts) and answers one JSON line
per JSON request line on stdin ({"row", "concurrency", "requests"} -> {"value", "lengths"}). Each engine
and model has a process of its own (see ANCHOR_MODELS): CTranslate2 and torch each bring a libgomp, and two
OpenMP runtimes in one process slowed HF's decoding 4x here; bench_anchor's HTTP client uses neither.

Each model the rows run on is one AnchorModel record in ANCHOR_MODELS: its rows, how its Hugging Face
reference is built and converted, and how each engine loads and runs it. Nothing else is keyed by model.
The engines are in anchor_ct2.py, anchor_hf.py and anchor_ours.py (ours in process), the models they load
in anchor_references.py and anchor_llama.py, the workloads' shapes in anchor_shapes.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from benchmarks.anchor_ct2 import CT2Classifier, CT2Embedder, CT2Generator, CT2Translator
from benchmarks.anchor_hf import HFClassifier, HFEmbedder, HFGenerator, HFTranslator
from benchmarks.anchor_llama import llama_facts, llama_folder, llama_served, prepare_llama
from benchmarks.anchor_ours import OursClassifier, OursEmbedder, OursGenerator, OursTranslator, Served
from benchmarks.anchor_references import (
    Reference,
    bert_classifier,
    bert_encoder,
    build_reference,
    export_random_weights,
    gpt2,
    link_served,
    marian_mt,
    save_head,
)
from benchmarks.anchor_shapes import (
    LLAMA,
    Decoding,
    Encoding,
    Generating,
    Greedy,
    Run,
    Setup,
    Shapes,
    Translating,
    dims,
    shape_options,
)

if TYPE_CHECKING:
    from benchmarks.http_load import Client, Connection


# --- the models: one record each -----------------------------------------------------------------------------


class Clients(Protocol):
    """Our server's HTTP client of each workload (benchmarks/anchor.py's Ours); lengths forced."""

    def generate(self, stream: bool, model: str, prompt: list[int]) -> Client: ...

    def translate(self, beams: int) -> Client: ...

    def classify(self, conn: Connection) -> Awaitable[tuple[int, float | None]]: ...

    def embed(self, conn: Connection) -> Awaitable[tuple[int, float | None]]: ...


R = TypeVar("R")  # what an engine loads a model as: Generating, Decoding, Translating or Encoding


@dataclass(frozen=True)
class Row(Generic[R]):
    """One row of the table: its workload, and how each engine (ours over HTTP too) runs a request of it."""

    workload: str
    unit: str
    concurrency: int
    requests: int  # at --scale 1
    run: Callable[[R], Run]  # a loaded engine's batch function
    http: Callable[[Clients, Shapes], Client]  # our server's request


@dataclass(frozen=True)
class TokenCheck(Generic[R]):
    """Greedy tokens of ours in process and CTranslate2 on the same prompts (Shapes.check_prompts)."""

    label: str  # the model, in the line the run prints
    greedy: Callable[[R], Greedy]
    facts: Callable[[str, dict[str, Any]], dict[str, Any]]  # (--llama-size, the check) -> its JSON entry


@dataclass(frozen=True)
class AnchorModel(Generic[R]):
    """One model the rows run on. Each (engine, model) pair gets a process of its own: with CTranslate2 4.8.5
    here (AMD EPYC), loading an int8 model beside a float32 one halved the float32 generator's speed, and
    after a translator batch in the same process it decoded one request 4x slower."""

    name: str  # the engine processes' `part`
    artifact: str  # what our server serves it as; its folder in --artifacts and in --work
    rows: dict[str, Row[R]]
    ct2: Callable[[Setup], R]
    ours: Callable[[Setup], R]  # our engine in process
    hf: Callable[[Setup], R] | None = None  # None: no HF eager row
    reference: Reference | None = None  # its HF and CTranslate2 models in work/<artifact>; None: another's
    export: Callable[[Path, Path], None] | None = None  # (--artifacts/<artifact>, served/<artifact>) with --ours random
    build: Callable[[Path, str], Path] | None = None  # (work, llama size) -> what ours serves; None: --artifacts
    check: TokenCheck[R] | None = None  # its greedy tokens, checked against CTranslate2's before measuring
    server: str = "float32"  # which of our servers its rows go to: "float32", "int8" or its own (its name)
    int8_graphs: bool = True  # False: its graphs are float32 only (the int8 server does not serve it)
    floor_dimensions: Callable[[Path], int] | None = None  # the size of the floor's answers, from its folder

    def loader(self, engine: str) -> Callable[[Setup], R] | None:
        return {"ct2": self.ct2, "hf": self.hf, "engine": self.ours}[engine]


def _served(setup: Setup, kind: str, int8: bool = False) -> Served:
    return Served.load(setup.artifacts / kind, setup.threads, int8)


def _generate(engine: Generating) -> Run:
    return engine.generate


def _encoding(engine: Encoding) -> Run:
    return engine.encode


def encoder_rows(name: str, http: Callable[[Clients, Shapes], Client]) -> dict[str, Row[Encoding]]:
    """An encoder's two rows: 32 concurrent single texts, and one text at a time."""
    return {f"{name}_c32": Row(f"{name}, 32 concurrent single texts", "seq/s", 32, 128, _encoding, http),
            f"{name}_c1": Row(f"{name}, one text at a time", "seq/s", 1, 128, _encoding, http)}


ANCHOR_MODELS: dict[str, AnchorModel[Any]] = {model.name: model for model in (
    AnchorModel[Generating](
        "generator", "generator",
        rows={
            "generator_c16": Row("generator, 16 concurrent requests", "tok/s", 16, 48, _generate,
                                 lambda http, s: http.generate(False, "generator", s.prompt)),
            "generator_c16_stream": Row("generator, 16 concurrent, streamed", "tok/s", 16, 48, _generate,
                                        lambda http, s: http.generate(True, "generator", s.prompt)),
            "generator_c1": Row("generator, one request at a time", "tok/s", 1, 6, _generate,
                                lambda http, s: http.generate(False, "generator", s.prompt)),
        },
        ct2=lambda setup: CT2Generator(setup.work / "generator" / "ct2", setup, setup.shapes.prompt),
        ours=lambda setup: OursGenerator(setup, _served(setup, "generator"), setup.shapes.prompt),
        hf=lambda setup: HFGenerator(setup, "generator", setup.shapes.prompt),
        reference=Reference(gpt2), export=export_random_weights,
    ),
    AnchorModel[Translating](
        "translator", "translator",
        rows={
            "translator_beam4_c16": Row("translator, 16 concurrent, beam 4", "tok/s", 16, 32,
                                        lambda engine: engine.translate(4), lambda http, s: http.translate(4)),
            "translator_greedy_c16": Row("translator, 16 concurrent, greedy", "tok/s", 16, 48,
                                         lambda engine: engine.translate(1), lambda http, s: http.translate(1)),
        },
        ct2=lambda setup: CT2Translator(setup.work / "translator" / "ct2", setup),
        ours=lambda setup: OursTranslator(setup, _served(setup, "translator")),
        hf=lambda setup: HFTranslator(setup, "translator"),
        reference=Reference(marian_mt, marian=True), export=export_random_weights,
    ),
    AnchorModel[Encoding](
        "classifier", "classifier",
        rows=encoder_rows("classifier", lambda http, s: http.classify),
        ct2=lambda setup: CT2Classifier(setup.work / "classifier" / "ct2", setup,
                                        setup.work / "classifier" / "hf" / "head.npz"),
        ours=lambda setup: OursClassifier(setup, _served(setup, "classifier")),
        hf=lambda setup: HFClassifier(setup, "classifier"),
        reference=Reference(bert_classifier, save=save_head), export=export_random_weights,
    ),
    AnchorModel[Generating](  # the generator's artifact and references, int8 (no HF eager row)
        "generator-int8", "generator",
        rows={"generator_int8_c16": Row("int8 generator, 16 concurrent (vs CT2 int8)", "tok/s", 16, 48, _generate,
                                        lambda http, s: http.generate(False, "generator", s.prompt))},
        ct2=lambda setup: CT2Generator(setup.work / "generator" / "ct2", setup, setup.shapes.prompt, "int8"),
        ours=lambda setup: OursGenerator(setup, _served(setup, "generator", int8=True), setup.shapes.prompt),
        server="int8",
    ),
    AnchorModel[Encoding](  # served as it is (its weights come from a package)
        "embedder", "embedder",
        rows=encoder_rows("embedder", lambda http, s: http.embed),
        ct2=lambda setup: CT2Embedder(setup.work / "embedder" / "ct2", setup),
        ours=lambda setup: OursEmbedder(setup, _served(setup, "embedder")),
        hf=lambda setup: HFEmbedder(setup, "embedder"),
        reference=Reference(bert_encoder), export=link_served, int8_graphs=False,
        floor_dimensions=lambda folder: int(dims(folder)["d_model"]),
    ),
    AnchorModel[Decoding](  # built here with random weights (--llama-size); no HF eager row
        LLAMA, LLAMA,
        rows={
            "llama_c16": Row("Llama-shaped (grouped-query) generator, 16 concurrent", "tok/s", 16, 48, _generate,
                             lambda http, s: http.generate(False, LLAMA, s.llama_prompt)),
            "llama_c1": Row("Llama-shaped generator, one request at a time", "tok/s", 1, 6, _generate,
                            lambda http, s: http.generate(False, LLAMA, s.llama_prompt)),
        },
        ct2=lambda setup: CT2Generator(llama_folder(setup.work, setup.shapes.llama_size) / "ct2", setup,
                                       setup.shapes.llama_prompt),
        ours=lambda setup: OursGenerator(
            setup, Served.load(llama_served(setup.work, setup.shapes.llama_size) / LLAMA, setup.threads),
            setup.shapes.llama_prompt),
        build=prepare_llama, check=TokenCheck("Llama-shaped", lambda engine: engine.greedy, llama_facts),
        server=LLAMA,
    ),
)}
# Our artifacts the rows read from --artifacts, in the table's order (each also names its float32 model).
KINDS = tuple(dict.fromkeys(m.artifact for m in ANCHOR_MODELS.values() if m.build is None))
ROWS: dict[str, Row[Any]] = {row: spec for m in ANCHOR_MODELS.values() for row, spec in m.rows.items()}
PARTS = {row: m.name for m in ANCHOR_MODELS.values() for row in m.rows}  # the model each row runs on


def model_of(row: str) -> AnchorModel[Any]:
    """The model a row runs on."""
    return ANCHOR_MODELS[PARTS[row]]


def row_kind(row: str) -> str:
    """The artifact a row runs on."""
    return model_of(row).artifact


def parts_of(rows: list[str]) -> set[str]:
    return {PARTS[row] for row in rows}


def export_random(artifacts: Path, out: Path, kinds: tuple[str, ...] | None = None) -> None:
    """Our models with the dims of `artifacts` and random weights (their tokenizers), float32 and int8 graphs,
    or linked where its record says so (each model's `export`)."""
    for kind in kinds if kinds is not None else KINDS:
        export = ANCHOR_MODELS[kind].export
        if export is not None:
            export(artifacts / kind, out / kind)


def build_hf_and_ct2(artifacts: Path, work: Path, kinds: tuple[str, ...] | None = None) -> None:
    """work/<kind>/hf: a saved random transformers model (+ a tokenizer made from ours); work/<kind>/ct2: converted."""
    for kind in kinds if kinds is not None else KINDS:
        reference = ANCHOR_MODELS[kind].reference
        if reference is not None:
            build_reference(reference, artifacts / kind, work / kind)


def batched(run: Run, concurrency: int, requests: int) -> tuple[float, list[int]]:
    """Units per second over ceil(requests / concurrency) batches, after one untimed batch."""
    run(concurrency)
    lengths: list[int] = []
    units, started = 0, time.perf_counter()
    for _ in range(-(-requests // concurrency)):
        u, lens = run(concurrency)
        units, lengths = units + u, lengths + lens
    return units / (time.perf_counter() - started), lengths


@dataclass
class Loaded:
    """One model on one engine: the batch function of each of its rows, and its greedy check if it has one."""

    runs: dict[str, Run]
    greedy: Greedy | None = None


def load(engine: str, part: str, setup: Setup) -> Loaded:
    model = ANCHOR_MODELS[part]
    loader = model.loader(engine)
    if loader is None:
        raise SystemExit(f"no {engine} engine for {part}")
    loaded = loader(setup)
    return Loaded({row: spec.run(loaded) for row, spec in model.rows.items()},
                  model.check.greedy(loaded) if model.check is not None else None)


def main() -> None:
    """Load one engine, then answer requests (the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("ct2", "hf", "engine"))
    parser.add_argument("part", choices=sorted(ANCHOR_MODELS))
    parser.add_argument("--artifacts", type=Path, required=True, help="our artifacts (tokenizers, dims)")
    parser.add_argument("--work", type=Path, required=True, help="where build_hf_and_ct2 saved the models")
    shape_options(parser)
    args = parser.parse_args()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    setup = Setup(args.artifacts, args.work, Shapes(args, args.artifacts), args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load(args.engine, args.part, setup)
    try:
        protocol.write(json.dumps({"ready": True}) + "\n")
        for line in sys.stdin:
            ask = json.loads(line)
            if "greedy" in ask:  # the agreement check: {"greedy": prompts} -> {"tokens": each one's tokens}
                if loaded.greedy is None:
                    raise SystemExit(f"{args.part} has no greedy check")
                protocol.write(json.dumps({"tokens": loaded.greedy(ask["greedy"])}) + "\n")
                continue
            value, lengths = batched(loaded.runs[ask["row"]], ask["concurrency"], ask["requests"])
            protocol.write(json.dumps({"value": value, "lengths": lengths}) + "\n")
    except BrokenPipeError:  # bench_anchor stopped (e.g. a server failed to start): its error is the one to read
        pass


if __name__ == "__main__":
    main()
