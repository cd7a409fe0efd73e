"""The GLUE metric without the hub: the formulas of ``evaluate.load("glue", task)`` in numpy.

``evaluate``'s glue module computes accuracy as ``(preds == labels).mean()``, F1 with
``sklearn.metrics.f1_score`` (binary, positive label 1), Matthews correlation with
``sklearn.metrics.matthews_corrcoef`` and Pearson / Spearman with ``scipy.stats``. The same
formulas are written out here, step for step as sklearn / scipy compute them, so the script
scores identically offline (bit for bit, checked against evaluate's glue module with
sklearn 1.9 / scipy 1.17), needing neither the hub nor sklearn / scipy. Inputs are cast as the
module's features cast them (int64, or float32 for STS-B) before the formulas run.
"""

from __future__ import annotations

import numpy as np

KEYS_BY_TASK = {
    "cola": ("matthews_correlation",),
    "stsb": ("pearson", "spearmanr"),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    **{t: ("accuracy",) for t in ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "hans")},
}


def accuracy(preds, labels) -> float:
    return float((np.asarray(preds) == np.asarray(labels)).mean())


def f1_binary(preds, labels) -> float:
    """F1 of the positive class 1; 0.0 when nothing is predicted or labelled positive (sklearn's default)."""
    preds, labels = np.asarray(preds) == 1, np.asarray(labels) == 1
    tp = float(np.sum(preds & labels))
    denominator = 2 * tp + float(np.sum(preds & ~labels)) + float(np.sum(~preds & labels))
    return 2 * tp / denominator if denominator else 0.0


def matthews_correlation(labels, preds) -> float:
    """Multiclass Matthews correlation from the confusion matrix; 0.0 when it is undefined."""
    labels, preds = np.asarray(labels), np.asarray(preds)
    classes, codes = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    true_codes, pred_codes = codes[: len(labels)], codes[len(labels) :]
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (true_codes, pred_codes), 1.0)
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n_correct, n = np.trace(confusion), p_sum.sum()
    cov_ytyp = n_correct * n - np.dot(t_sum, p_sum)
    cov_ypyp = n**2 - np.dot(p_sum, p_sum)
    cov_ytyt = n**2 - np.dot(t_sum, t_sum)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ypyp * cov_ytyt))


def pearson(x, y) -> float:
    """Pearson's r, computed in the inputs' float precision with scipy's steps (centre, scale by
    the largest deviation, normalise, dot), so float32 inputs give scipy's float32 result.
    NaN when either input is constant (scipy warns and returns NaN too)."""
    x, y = np.asarray(x), np.asarray(y)
    dtype = np.result_type(x.dtype, y.dtype)
    dtype = dtype if np.issubdtype(dtype, np.floating) else np.float64  # integers: float64, as scipy
    x, y = x.astype(dtype), y.astype(dtype)
    xm, ym = x - x.mean(keepdims=True), y - y.mean(keepdims=True)
    xmax, ymax = np.abs(xm).max(), np.abs(ym).max()
    if xmax == 0 or ymax == 0:
        return float("nan")
    norm_x = xmax * np.linalg.norm(xm / xmax, ord=2, axis=-1)  # with axis: scipy's summation order
    norm_y = ymax * np.linalg.norm(ym / ymax, ord=2, axis=-1)
    return float(np.clip(np.vecdot(xm / norm_x, ym / norm_y), -1.0, 1.0))


def average_ranks(values) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank (scipy.stats.rankdata's 'average')."""
    values = np.asarray(values)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    starts = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(values)] - 1
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = (first[group] + last[group]) / 2.0 + 1.0
    return ranks


def spearman(x, y) -> float:
    """Pearson's r of the average ranks, through np.corrcoef as scipy.stats.spearmanr computes it."""
    x, y = np.asarray(x), np.asarray(y)
    if (x == x[0]).all() or (y == y[0]).all():
        return float("nan")
    ranks = np.column_stack([average_ranks(x), average_ranks(y)])
    return float(np.corrcoef(ranks, rowvar=False)[1, 0])


def compute(task: str, predictions, references) -> dict[str, float]:
    """What ``evaluate.load("glue", task).compute(predictions=..., references=...)`` returns."""
    if task not in KEYS_BY_TASK:
        raise KeyError(f"unknown GLUE metric config {task!r}: one of {sorted(KEYS_BY_TASK)}")
    dtype = np.float32 if task == "stsb" else np.int64
    preds, labels = np.asarray(predictions).astype(dtype), np.asarray(references).astype(dtype)
    if task == "cola":
        return {"matthews_correlation": matthews_correlation(labels, preds)}
    if task == "stsb":
        return {"pearson": pearson(preds, labels), "spearmanr": spearman(preds, labels)}
    if task in ("mrpc", "qqp"):
        return {"accuracy": accuracy(preds, labels), "f1": f1_binary(preds, labels)}
    return {"accuracy": accuracy(preds, labels)}


class LocalGlueMetric:
    """Stands in for the loaded ``evaluate`` module: same ``compute`` call, same result keys."""

    def __init__(self, task: str):
        if task not in KEYS_BY_TASK:
            raise KeyError(f"unknown GLUE metric config {task!r}: one of {sorted(KEYS_BY_TASK)}")
        self.task = task

    def compute(self, *, predictions, references) -> dict[str, float]:
        return compute(self.task, predictions, references)

    def __repr__(self) -> str:
        return f"LocalGlueMetric({self.task!r})"
