"""Classification and regression metrics for GLUE and for the user's own labelled data.

Small numpy implementations, so evaluation needs neither scikit-learn nor scipy at run time; the
tests check them against both. Values are fractions in [0, 1] (correlations in [-1, 1]), not
percentages: that is the GLUE convention of the Hugging Face and NVIDIA fine-tuning scripts whose
numbers users compare against. Every returned value is a Python ``float``, so results can go
straight into JSON logs.

``preds`` are predicted class ids (argmax already taken), or predicted values for regression.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from bertforge.errors import DataError

ArrayLike = Sequence[float] | Sequence[int] | np.ndarray

# Task name -> metric family. MNLI appears under each name its splits go by.
_GLUE_TASKS = {
    "cola": "mcc", "sst2": "acc", "qnli": "acc", "rte": "acc", "wnli": "acc",
    "mnli": "acc", "mnli-m": "acc", "mnli-mm": "acc", "mnli-matched": "acc",
    "mnli-mismatched": "acc",
    "mrpc": "acc_f1", "qqp": "acc_f1", "stsb": "corr",
}
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb"}


def _pair(preds: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as flat arrays of one, non-zero length (a silent broadcast would lie)."""
    p, y = np.asarray(preds).reshape(-1), np.asarray(labels).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"{p.size} predictions for {y.size} labels; they must pair up")
    if p.size == 0:
        raise ValueError("no predictions to score")
    return p, y


def accuracy(preds: ArrayLike, labels: ArrayLike) -> float:
    """Fraction of predictions equal to their label."""
    p, y = _pair(preds, labels)
    return float(np.mean(p == y))


def _f1_of(p: np.ndarray, y: np.ndarray, positive: object) -> float:
    """F1 of one class as 2TP / (2TP + FP + FN); 0.0 when the class is in neither input."""
    tp = int(np.sum((p == positive) & (y == positive)))
    fp = int(np.sum((p == positive) & (y != positive)))
    fn = int(np.sum((p != positive) & (y == positive)))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def f1_binary(preds: ArrayLike, labels: ArrayLike, positive: int = 1) -> float:
    """F1 of the ``positive`` class (MRPC and QQP report it for class 1, "paraphrase")."""
    p, y = _pair(preds, labels)
    return float(_f1_of(p, y, positive))


def f1_macro(preds: ArrayLike, labels: ArrayLike) -> float:
    """Unweighted mean of per-class F1 over the classes seen in ``labels`` or ``preds``.

    Classes absent from both have no defined F1 and are left out rather than counted as 0.
    """
    p, y = _pair(preds, labels)
    classes = np.union1d(p, y)
    return float(np.mean([_f1_of(p, y, c) for c in classes]))


def matthews_corrcoef(preds: ArrayLike, labels: ArrayLike) -> float:
    """Matthews correlation for any number of classes (Gorodkin's R_K); 0.0 when undefined.

    From the confusion matrix: (correct * n - sum_k t_k p_k) / sqrt((n^2 - sum p_k^2)(n^2 -
    sum t_k^2)) with t_k / p_k the true / predicted counts of class k. It is undefined when
    either side predicts a single class, which CoLA models early in training do.
    """
    p, y = _pair(preds, labels)
    classes, codes = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = len(classes)
    conf = np.zeros((k, k), dtype=np.float64)
    np.add.at(conf, (codes[: y.size], codes[y.size:]), 1.0)
    t, pk = conf.sum(axis=1), conf.sum(axis=0)
    n, correct = float(y.size), float(np.trace(conf))
    denom = math.sqrt((n * n - float(pk @ pk)) * (n * n - float(t @ t)))
    return float((correct * n - float(t @ pk)) / denom) if denom else 0.0


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; ``nan`` for a constant input, where it is undefined (as in scipy)."""
    a, b = _pair(x, y)
    a, b = a.astype(np.float64), b.astype(np.float64)
    a, b = a - a.mean(), b - b.mean()
    denom = math.sqrt(float(a @ a) * float(b @ b))
    if denom == 0.0:
        return math.nan
    return float(max(-1.0, min(1.0, float(a @ b) / denom)))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size, dtype=np.float64)
    sorted_vals = values[order]
    # Start index of each run of equal values in sorted order, plus the end.
    starts = np.flatnonzero(np.r_[True, sorted_vals[1:] != sorted_vals[:-1]])
    bounds = np.r_[starts, values.size]
    for lo, hi in pairwise(bounds):
        ranks[order[lo:hi]] = (lo + 1 + hi) / 2.0
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation: Pearson of the average ranks (ties handled as in scipy)."""
    a, b = _pair(x, y)
    return pearson(_average_ranks(a), _average_ranks(b))


def _task_key(task_name: str) -> str:
    """Canonical GLUE task name: case, "_" vs "-" and the dashed spellings do not matter."""
    key = task_name.strip().lower().replace("_", "-")
    return _ALIASES.get(key, key)


def glue_metrics(task_name: str, preds: ArrayLike, labels: ArrayLike) -> dict[str, float]:
    """The metrics GLUE reports for ``task_name``, under their customary names (fractions).

    cola: matthews_correlation; sst2, qnli, rte, wnli, mnli (any split): accuracy;
    mrpc, qqp: accuracy and f1 (class 1); stsb: pearson and spearmanr.
    """
    family = _GLUE_TASKS.get(_task_key(task_name))
    if family is None:
        raise DataError(f"unknown GLUE task {task_name!r}; expected one of "
                        f"{', '.join(sorted(_GLUE_TASKS))}")
    if family == "mcc":
        return {"matthews_correlation": matthews_corrcoef(preds, labels)}
    if family == "acc":
        return {"accuracy": accuracy(preds, labels)}
    if family == "acc_f1":
        return {"accuracy": accuracy(preds, labels), "f1": f1_binary(preds, labels)}
    return {"pearson": pearson(preds, labels), "spearmanr": spearman(preds, labels)}


def classification_metrics(preds: ArrayLike, labels: ArrayLike, num_labels: int,
                           regression: bool = False) -> dict[str, float]:
    """Metrics for a user's own task.

    Classification: accuracy and f1_macro, plus f1 (of class 1) when there are two labels;
    ids must lie in ``[0, num_labels)``, since anything else means preds and labels disagree on
    the label set. Regression: pearson, spearmanr and mse.
    """
    p, y = _pair(preds, labels)
    if regression:
        diff = p.astype(np.float64) - y.astype(np.float64)
        return {"pearson": pearson(p, y), "spearmanr": spearman(p, y),
                "mse": float(np.mean(diff * diff))}
    for name, arr in (("predictions", p), ("labels", y)):
        bad = arr[(arr < 0) | (arr >= num_labels) | (arr != np.round(arr))]
        if bad.size:
            raise ValueError(f"{name} hold {bad[0].item()!r}, not a class id in "
                             f"[0, {num_labels})")
    out = {"accuracy": accuracy(p, y), "f1_macro": f1_macro(p, y)}
    if num_labels == 2:
        out["f1"] = f1_binary(p, y)
    return out
