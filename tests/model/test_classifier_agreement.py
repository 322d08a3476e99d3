"""scripts/classifier_agreement.py on the tiny classifier: every sentence in one band of its rater score,
the bands' accuracies adding up to the split's, and the errors shared out."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.data import write_jsonl
from model.training.pretrained_classifier import artifact_accuracy
from scripts.classifier_agreement import BANDS, agreement, table


def test_accuracy_by_rater_score(tiny_artifacts: Path, tmp_path: Path) -> None:
    scores = [-3.9, -2.5, -1.7, -1.2, -0.7, -0.2, 0.1, 0.6, 1.1, 1.6, 2.0, 4.0]
    texts = [f"the film number {i} was {'good' if s > 0 else 'bad'}" for i, s in enumerate(scores)]
    lines = [f"{i}\t{s}\t{t}\n" for i, (s, t) in enumerate(zip(scores, texts, strict=True))]
    hutto = tmp_path / "raw" / "hutto"
    hutto.mkdir(parents=True)
    (hutto / "movieReviewSnippets_GroundTruth.txt").write_text("id\tsentiment\ttext\n" + "".join(lines))
    rows = [{"text": t, "label": int(s > 0)} for s, t in zip(scores, texts, strict=True)]
    for split in ("valid", "test"):
        write_jsonl(tmp_path / "classification" / f"{split}.jsonl", rows)

    result = agreement(tiny_artifacts / "classifier", tmp_path)
    whole = artifact_accuracy(tiny_artifacts / "classifier", rows)
    for split in ("valid", "test"):
        record = result[split]
        assert record["accuracy"] == whole["accuracy"] and record["sentences"] == len(rows)
        bands = record["bands"]
        assert [b["band"] for b in bands] == [f"{low:g}-{high:g}" for low, high in BANDS]
        assert [b["sentences"] for b in bands] == [2, 2, 2, 2, 4]  # 2.0 and 4.0 land in the last band
        right = sum(b["accuracy"] * b["sentences"] for b in bands)
        assert right == pytest.approx(whole["accuracy"] * len(rows))
        if whole["accuracy"] < 1:
            assert sum(b["share_of_errors"] for b in bands) == pytest.approx(1.0)
    assert "| test | all | 12 |" in table(result)
