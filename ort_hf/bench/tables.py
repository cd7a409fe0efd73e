"""Classification tables for the bench (``--train_file`` CSV, TSV or JSON lines): which columns
hold the text, one sentence or a pair, and which the label, named as GLUE's files and
transformers' run_glue name them; label ids for integer or string labels. Cheap to import (the runner checks a table
before it starts any worker)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# First match wins: pairs before single sentences ("question","sentence" is QNLI's pair).
TEXT_COLUMNS = (
    ("sentence1", "sentence2"),
    ("#1 string", "#2 string"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("premise", "hypothesis"),
    ("sentence",),
    ("text",),
)
LABEL_COLUMNS = ("label", "labels", "quality", "gold_label")


class BadTable(ValueError):
    """``--train_file`` cannot be read as a classification table; the message says what to change."""


@dataclass
class Table:
    texts: tuple[list[str], ...]  # one list per text column: one, or two for sentence pairs
    labels: list[int]
    label_names: list[str]  # label_names[i] is the class with id i


TABLE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl")


def read_table(path: Path, rows: int | None = None) -> Table:
    """The first ``rows`` complete rows (all when ``None``) of a CSV (``,``), TSV or JSON-lines file."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        records = _records(f, path)
        header = next(records, None)
        if not header:
            raise BadTable(
                f"{path} is empty: it needs a header row (CSV/TSV) or keys (JSON lines), e.g. sentence,label"
            )
        text_cols, label_col = _columns(header, path)
        texts: tuple[list[str], ...] = tuple([] for _ in text_cols)
        raw_labels: list[str] = []
        last = max(*text_cols, label_col)
        for record in records:
            if len(record) <= last:
                continue  # a blank or truncated line
            for column, out in zip(text_cols, texts):
                out.append(record[column].strip())
            raw_labels.append(record[label_col].strip())
            if rows is not None and len(raw_labels) == rows:
                break
    if not raw_labels:
        raise BadTable(f"{path} has a header but no complete rows")
    labels, names = _label_ids(raw_labels, path)
    return Table(texts, labels, names)


def _records(f, path: Path) -> Iterator[list[str]]:
    """The header, then each row, as lists of strings (a JSON line missing a key comes as [])."""
    if path.suffix.lower() not in (".json", ".jsonl"):
        tab = path.suffix.lower() == ".tsv"
        yield from csv.reader(f, delimiter="\t" if tab else ",", quoting=csv.QUOTE_NONE if tab else csv.QUOTE_MINIMAL)
        return
    keys: list[str] | None = None
    for number, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            raise BadTable(
                f"{path.name}: line {number} is not a JSON object; the bench reads JSON lines "
                "(one object per line, as datasets' to_json writes them)"
            )
        if keys is None:
            keys = list(record)
            yield keys
        values = [record.get(key) for key in keys]
        yield [] if any(v is None for v in values) else [str(v) for v in values]


def _columns(header: list[str], path: Path) -> tuple[tuple[int, ...], int]:
    names = [h.strip().lower() for h in header]
    text = next((cols for cols in TEXT_COLUMNS if all(c in names for c in cols)), None)
    label = next((c for c in LABEL_COLUMNS if c in names), None)
    if text is None or label is None:
        wanted = " / ".join(",".join(cols) for cols in TEXT_COLUMNS)
        raise BadTable(
            f"{path.name}: cannot tell the text and label columns from the header {header}. Name the text "
            f"column(s) one of: {wanted}; and the label column one of: {', '.join(LABEL_COLUMNS)}"
        )
    return tuple(names.index(c) for c in text), names.index(label)


def _label_ids(raw: list[str], path: Path) -> tuple[list[int], list[str]]:
    """Whole-number labels (1, or 1.0 from a float column) are class ids (0..max); labels that are
    not numbers are class names, ids in sorted order; other numbers are a regression target."""
    try:
        numbers = [float(value) for value in raw]
    except ValueError:
        names = sorted(set(raw))
        index = {name: i for i, name in enumerate(names)}
        return [index[value] for value in raw], names
    if not all(n.is_integer() for n in numbers):
        raise BadTable(f"{path.name}: the labels are real numbers (a regression target); the bench trains classifiers")
    ids = [int(n) for n in numbers]
    if min(ids) < 0:
        raise BadTable(f"{path.name}: label {min(ids)} is negative (unlabelled test rows?): use labelled rows")
    return ids, [str(i) for i in range(max(ids) + 1)]
