"""GLUE tasks: their text columns, labels and metric, and a reader for the TSVs as GLUE distributes them.

Every source (``--data_dir`` TSVs, the hub's ``nyu-mll/glue``, CSV/JSON files) ends up with the
hub's column names (``sentence1``/``sentence2``, ``premise``/``hypothesis``, ...) and the hub's
label ids, so a model trained from one source evaluates on another.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task. ``tsv_columns`` names (or, for header-less files, indexes) the TSV columns
    that become ``keys`` and ``label``; labels are the hub's ids (``label_names`` order)."""

    keys: tuple[str, ...]  # text columns, in the hub dataset's names
    tsv_columns: tuple[str | int, ...]  # the same texts in the GLUE TSV
    tsv_label: str | int
    label_names: tuple[str, ...] | None  # None: regression (STS-B)
    metric: str  # the main metric, a key of the GLUE metric's result
    dev_splits: tuple[str, ...] = ("validation",)
    tsv_header: bool = True

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)


GLUE_TASKS: dict[str, GlueTask] = {
    # CoLA train/dev have no header: source, label, original label, sentence.
    "cola": GlueTask(("sentence",), (3,), 1, ("unacceptable", "acceptable"), "matthews_correlation", tsv_header=False),
    "sst2": GlueTask(("sentence",), ("sentence",), "label", ("negative", "positive"), "accuracy"),
    "mrpc": GlueTask(
        ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality", ("not_equivalent", "equivalent"), "f1"
    ),
    "qqp": GlueTask(
        ("question1", "question2"), ("question1", "question2"), "is_duplicate", ("not_duplicate", "duplicate"), "f1"
    ),
    "stsb": GlueTask(("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", None, "pearson"),
    "mnli": GlueTask(
        ("premise", "hypothesis"),
        ("sentence1", "sentence2"),
        "gold_label",
        ("entailment", "neutral", "contradiction"),
        "accuracy",
        dev_splits=("validation_matched", "validation_mismatched"),
    ),
    "qnli": GlueTask(
        ("question", "sentence"), ("question", "sentence"), "label", ("entailment", "not_entailment"), "accuracy"
    ),
    "rte": GlueTask(
        ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), "accuracy"
    ),
    "wnli": GlueTask(
        ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", ("not_entailment", "entailment"), "accuracy"
    ),
}

# File names in a GLUE task folder for each split name the script uses (the hub's split names).
_TSV_FILES = {
    "train": "train.tsv",
    "validation": "dev.tsv",
    "validation_matched": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
    "test": "test.tsv",
    "test_matched": "test_matched.tsv",
    "test_mismatched": "test_mismatched.tsv",
}


def tsv_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / _TSV_FILES[split]


def read_tsv(path: str | Path) -> list[list[str]]:
    """Rows of a GLUE TSV, split on tabs only: quotes are text (MRPC has unbalanced ``"``), and a
    UTF-8 byte-order mark at the start (MRPC's header) is dropped."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        return [row for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if row]


def _label_id(task: GlueTask, raw: str) -> int | float:
    raw = raw.strip()
    if task.is_regression:
        return float(raw)
    if raw in task.label_names:  # MNLI / QNLI / RTE write label names
        return task.label_names.index(raw)
    return int(raw)  # the others write the id


def read_glue_split(task: GlueTask, path: str | Path, with_labels: bool = True) -> dict[str, list]:
    """One GLUE TSV as columns ``{key: [...], "label": [...]}``. Rows whose field count differs
    from the header's (a few broken QQP lines) are skipped and counted in one log line.
    ``with_labels=False`` reads test files, which have no label column."""
    rows = read_tsv(path)
    if task.tsv_header or not with_labels:  # test files have a header even for CoLA
        header, rows = rows[0], rows[1:]
        columns = task.tsv_columns if task.tsv_header else ("sentence",)
        index = {name: i for i, name in enumerate(header)}
        missing = [c for c in (*columns, *([task.tsv_label] if with_labels else [])) if c not in index]
        if missing:
            raise ValueError(f"{path}: columns {missing} not in the header {header} (is this the right task?)")
        text_idx = [index[c] for c in columns]
        label_idx = index[task.tsv_label] if with_labels else None
        width = len(header)
    else:
        text_idx, label_idx, width = list(task.tsv_columns), task.tsv_label, None
    data: dict[str, list] = {key: [] for key in task.keys}
    if with_labels:
        data["label"] = []
    needed = max(text_idx + ([label_idx] if label_idx is not None else [])) + 1
    skipped = 0
    for row in rows:
        if (width is not None and len(row) != width) or len(row) < needed:
            skipped += 1
            continue
        for key, i in zip(task.keys, text_idx):
            data[key].append(row[i])
        if with_labels:
            data["label"].append(_label_id(task, row[label_idx]))
    if skipped:
        logger.warning("%s: skipped %d malformed row(s) of %d", path, skipped, len(rows))
    return data
