"""Where each workload's training data comes from; cheap to import (the runner checks data
before it starts any worker)."""

from __future__ import annotations

from pathlib import Path

from .spec import BenchSettings, Workload

# WikiText-2's train split is not in ../shared/data (see its SOURCES.md): the test split, then
# the validation split, stand in; for throughput the split does not matter.
WIKITEXT = ("wikitext-2-raw/wiki.test.raw", "wikitext-2-raw/wiki.valid.raw")
SST2 = "glue/SST-2/train.tsv"


class DataMissing(Exception):
    """The workload's data is not there: the workload is skipped with this message."""


def data_file(workload: Workload, settings: BenchSettings) -> Path:
    if settings.train_file:
        path = Path(settings.train_file)
        if not path.is_file():
            raise DataMissing(f"--train_file {path} does not exist")
        is_table = path.suffix.lower() in (".csv", ".tsv")
        if workload.task == "cls" and not is_table:
            raise DataMissing(f"{workload.name} needs a CSV/TSV with sentence,label; --train_file is {path.name}")
        if workload.task != "cls" and is_table:
            raise DataMissing(f"{workload.name} needs a text file; --train_file is a table ({path.name})")
        return path
    root = Path(settings.data_dir)
    candidates = [SST2] if workload.task == "cls" else list(WIKITEXT)
    for rel in candidates:
        if (root / rel).is_file():
            return root / rel
    raise DataMissing(f"{workload.name}: none of {', '.join(candidates)} under {root} (pass --train_file)")
