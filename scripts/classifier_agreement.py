"""A served sentiment classifier's accuracy by how far the movie raters leaned: the valid and test sentences
grouped by the absolute mean rater score behind their label (Hutto & Gilbert's scores run from -4 to 4;
the label is the score's sign), scored with ONNX Runtime as the server runs the artifact.

    python -m scripts.classifier_agreement artifacts/classifier-minilm --out bench_results/classifier_agreement.json

It says where the errors are: on sentences the raters barely leaned on, a label is close to a coin
toss, and no classifier can be right on all of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from model.data.classification import MOVIE_FILE, rater_scores, read_ground_truth
from model.tasks.classification import read_labelled
from model.training.pretrained_classifier import artifact_predictions

BANDS = ((0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0), (2.0, 4.0))  # absolute mean score: from <= it < to


def band_of(score: float) -> int:
    """The index in BANDS of ``score``'s absolute value (the last band also holds 4, the scale's end)."""
    return next((i for i, (_, high) in enumerate(BANDS) if abs(score) < high), len(BANDS) - 1)


def agreement(artifact: Path, data_dir: Path, splits: tuple[str, ...] = ("valid", "test")) -> dict[str, Any]:
    """Per split: its accuracy, and per band of the absolute score the sentences, their accuracy and their
    share of the split's errors."""
    scores = rater_scores(read_ground_truth(data_dir / "raw" / "hutto" / MOVIE_FILE))
    out: dict[str, Any] = {}
    for split in splits:
        rows = read_labelled(data_dir / "classification" / f"{split}.jsonl")
        right = artifact_predictions(artifact, rows) == np.array([r["label"] for r in rows])
        band = np.array([band_of(scores[r["text"]]) for r in rows])
        errors = int((~right).sum())
        out[split] = {"accuracy": float(right.mean()), "sentences": len(rows), "bands": [
            {"band": f"{low:g}-{high:g}", "sentences": int((band == i).sum()),
             "accuracy": float(right[band == i].mean()) if (band == i).any() else 0.0,
             "share_of_errors": int((~right[band == i]).sum()) / errors if errors else 0.0}
            for i, (low, high) in enumerate(BANDS)]}
    return out


def table(result: dict[str, Any]) -> str:
    lines = ["| split | absolute mean score | sentences | accuracy | share of the errors |", "|---|---|---|---|---|"]
    for split, record in result.items():
        for band in record["bands"]:
            lines.append(f"| {split} | {band['band']} | {band['sentences']} | {100 * band['accuracy']:.1f}% | "
                         f"{100 * band['share_of_errors']:.0f}% |")
        lines.append(f"| {split} | all | {record['sentences']} | {100 * record['accuracy']:.1f}% | 100% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    result = agreement(args.artifact, args.data)
    print(table(result))
    if args.out is not None:
        args.out.write_text(json.dumps({"artifact": str(args.artifact), **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
