"""Classification / regression metrics: hand-computed values and parity with scikit-learn/scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertforge.errors import DataError
from bertforge.metrics.classification import (
    accuracy,
    classification_metrics,
    f1_binary,
    f1_macro,
    glue_metrics,
    matthews_corrcoef,
    pearson,
    spearman,
)


def test_hand_computed() -> None:
    preds, labels = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]
    # TP 2, FP 1, FN 1, TN 2.
    assert accuracy(preds, labels) == pytest.approx(4 / 6)
    assert f1_binary(preds, labels) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert f1_binary(preds, labels, positive=0) == pytest.approx(4 / 6)
    # (TP*TN - FP*FN) / sqrt(3*3*3*3) = 3/9.
    assert matthews_corrcoef(preds, labels) == pytest.approx(1 / 3)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # Ranks of [10, 20, 20, 30] are [1, 2.5, 2.5, 4]; of [1, 3, 2, 4] themselves.
    r1, r2 = np.array([1, 2.5, 2.5, 4]), np.array([1, 3, 2, 4])
    assert spearman([10, 20, 20, 30], [1, 3, 2, 4]) == pytest.approx(np.corrcoef(r1, r2)[0, 1])


def test_multiclass_mcc_by_hand() -> None:
    # Confusion (rows true, cols pred): [[2,1,0],[0,1,1],[1,0,2]]: n=8, correct=5,
    # t=[3,2,3], p=[3,2,3]: (5*8 - 22) / sqrt((64-22)(64-22)) = 18/42.
    labels = [0, 0, 0, 1, 1, 2, 2, 2]
    preds = [0, 0, 1, 1, 2, 0, 2, 2]
    assert matthews_corrcoef(preds, labels) == pytest.approx(18 / 42)


def test_undefined_values() -> None:
    assert matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0       # one predicted class
    assert matthews_corrcoef([1, 1], [1, 1]) == 0.0
    assert f1_binary([0, 0], [0, 0]) == 0.0                     # no positives anywhere
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="no predictions"):
        accuracy([], [])


def test_outputs_are_python_floats() -> None:
    for out in (glue_metrics("mrpc", np.array([1, 0]), np.array([1, 1])),
                glue_metrics("stsb", np.array([1.0, 2.0, 3.5]), np.array([1.5, 2.0, 3.0])),
                classification_metrics(np.array([0, 1, 2]), np.array([0, 1, 1]), 3),
                classification_metrics(np.array([0.5, 1.0]), np.array([0.0, 1.5]), 1, True)):
        assert all(type(v) is float for v in out.values()), out


@pytest.mark.parametrize("task, keys", [
    ("cola", ["matthews_correlation"]), ("CoLA", ["matthews_correlation"]),
    ("sst2", ["accuracy"]), ("SST-2", ["accuracy"]), ("qnli", ["accuracy"]),
    ("rte", ["accuracy"]), ("wnli", ["accuracy"]), ("mnli", ["accuracy"]),
    ("mnli-mm", ["accuracy"]), ("mnli_matched", ["accuracy"]), ("mnli_mismatched", ["accuracy"]),
    ("mrpc", ["accuracy", "f1"]), ("qqp", ["accuracy", "f1"]),
    ("stsb", ["pearson", "spearmanr"]), ("STS-B", ["pearson", "spearmanr"]),
])
def test_glue_metric_names(task: str, keys: list[str]) -> None:
    assert list(glue_metrics(task, [1, 0, 1, 2], [1, 0, 0, 2])) == keys


def test_glue_values_and_unknown_task() -> None:
    out = glue_metrics("mrpc", [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0])
    assert out == {"accuracy": pytest.approx(4 / 6), "f1": pytest.approx(2 / 3)}
    with pytest.raises(DataError, match="unknown GLUE task 'squad'"):
        glue_metrics("squad", [1], [1])


def test_classification_metrics() -> None:
    preds, labels = [0, 1, 2, 2, 1], [0, 1, 1, 2, 2]
    out = classification_metrics(preds, labels, num_labels=3)
    # Per-class F1: 0 -> 1, 1 -> 1/2, 2 -> 1/2.
    assert out == {"accuracy": pytest.approx(0.6), "f1_macro": pytest.approx(2 / 3)}
    binary = classification_metrics([1, 0, 1], [1, 1, 1], num_labels=2)
    assert set(binary) == {"accuracy", "f1_macro", "f1"}
    assert binary["f1"] == pytest.approx(0.8)
    reg = classification_metrics([1.0, 2.0, 4.0], [1.0, 3.0, 3.0], num_labels=1, regression=True)
    assert reg["mse"] == pytest.approx(2 / 3)
    assert set(reg) == {"pearson", "spearmanr", "mse"}
    with pytest.raises(ValueError, match=r"labels hold 3, not a class id in \[0, 3\)"):
        classification_metrics([0, 1], [0, 3], num_labels=3)


def test_parity_with_sklearn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for trial in range(40):
        k = int(rng.integers(2, 6))
        n = int(rng.integers(2, 60))
        labels = rng.integers(0, k, n)
        # Mostly-right predictions, so the metrics are not all near 0.
        preds = np.where(rng.random(n) < 0.6, labels, rng.integers(0, k, n))
        assert accuracy(preds, labels) == pytest.approx(metrics.accuracy_score(labels, preds))
        assert matthews_corrcoef(preds, labels) == pytest.approx(
            metrics.matthews_corrcoef(labels, preds), abs=1e-12)
        assert f1_macro(preds, labels) == pytest.approx(
            metrics.f1_score(labels, preds, average="macro", zero_division=0.0))
        if np.any(labels == 1) or np.any(preds == 1):
            assert f1_binary(preds, labels) == pytest.approx(
                metrics.f1_score(labels == 1, preds == 1, zero_division=0.0))


def test_parity_with_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(3, 80))
        # Few distinct values: plenty of ties for the ranks.
        x = rng.integers(0, 6, n).astype(float) / 2
        y = x + rng.integers(-3, 4, n) + rng.normal(0, 0.1, n).round(1)
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            continue
        assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
