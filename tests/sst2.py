"""Real SST-2 sentences from ../shared/data, tokenized for the packaged MiniLM."""

from __future__ import annotations

import csv
from pathlib import Path

from datasets import Dataset


def read_sst2(shared_data: Path, split: str = "train", limit: int = 256) -> list[tuple[str, int]]:
    rows = []
    with open(shared_data / "glue" / "SST-2" / f"{split}.tsv", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        for sentence, label in reader:
            rows.append((sentence.strip(), int(label)))
            if len(rows) == limit:
                break
    return rows


def sst2_dataset(shared_data: Path, tokenizer, limit: int = 256, max_length: int = 32) -> Dataset:
    rows = read_sst2(shared_data, limit=limit)
    enc = tokenizer([s for s, _ in rows], padding="max_length", truncation=True, max_length=max_length)
    return Dataset.from_dict({**enc, "labels": [y for _, y in rows]})
