"""The GLUE metric without the hub: what ``evaluate.load("glue", task)`` computes, with the same
library calls (sklearn's ``f1_score`` and ``matthews_corrcoef``, scipy's ``pearsonr`` and
``spearmanr``) on inputs cast as the module's features cast them (int64, or float32 for STS-B).
Used when evaluate cannot load its glue module offline; needs the examples extra."""

from __future__ import annotations

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

KEYS_BY_TASK = {
    "cola": ("matthews_correlation",),
    "stsb": ("pearson", "spearmanr"),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    **{t: ("accuracy",) for t in ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "hans")},
}


def compute(task: str, predictions, references) -> dict[str, float]:
    """What ``evaluate.load("glue", task).compute(predictions=..., references=...)`` returns."""
    if task not in KEYS_BY_TASK:
        raise KeyError(f"unknown GLUE metric config {task!r}: one of {sorted(KEYS_BY_TASK)}")
    dtype = np.float32 if task == "stsb" else np.int64
    preds, labels = np.asarray(predictions).astype(dtype), np.asarray(references).astype(dtype)
    if task == "cola":
        return {"matthews_correlation": float(matthews_corrcoef(labels, preds))}
    if task == "stsb":
        return {"pearson": float(pearsonr(preds, labels)[0]), "spearmanr": float(spearmanr(preds, labels)[0])}
    accuracy = float((preds == labels).mean())
    if task in ("mrpc", "qqp"):
        return {"accuracy": accuracy, "f1": float(f1_score(y_true=labels, y_pred=preds))}
    return {"accuracy": accuracy}


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
