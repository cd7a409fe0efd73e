"""``<out>/<task>.jsonl``: one JSON line per model type holding every mode's result, kept sorted by
model type whatever order the parallel workers finish in, and rewritten whole (atomically) after
each case, so an interrupted sweep loses at most the cases still running."""

from __future__ import annotations

import json
import os
from pathlib import Path


def results_path(out: Path, task: str) -> Path:
    return Path(out) / f"{task}.jsonl"


def read_results(path: Path) -> dict[str, dict]:
    """Model type -> its record, from a task's JSONL file (empty when there is none)."""
    if not path.is_file():
        return {}
    records = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records[record["model_type"]] = record
    return records


def write_results(path: Path, records: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".jsonl.partial")
    with open(partial, "w") as f:
        for model_type in sorted(records):
            f.write(json.dumps(records[model_type], sort_keys=True) + "\n")
    os.replace(partial, path)


def merge(earlier: dict | None, new: dict) -> dict:
    """``new``'s modes over ``earlier``'s (a later run of more modes keeps the modes it did not redo)."""
    if not earlier:
        return new
    return {**earlier, **new, "modes": {**earlier.get("modes", {}), **new["modes"]}}


def missing_modes(record: dict | None, modes: list[str], redo: bool) -> list[str]:
    """The modes of ``modes`` a case still needs (all of them with ``redo``)."""
    if redo or not record:
        return list(modes)
    return [m for m in modes if m not in record.get("modes", {})]
