"""Benchmark datasets: identical batches for every variant (static masking, fixed seed).

Defaults read ``--data_dir`` (WikiText-2 raw, GLUE SST-2); ``--train_file`` replaces them:
a text file (one document per line) for mlm/clm, a CSV/TSV for classification (columns as
:mod:`.tables` reads them: a sentence or a sentence pair, and a label).
"""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import ClassLabel, Dataset
from transformers import DataCollatorWithPadding, default_data_collator

from .sources import DataMissing, data_file
from .spec import BenchSettings, Workload
from .tables import read_table

MASK_PROB = 0.15


def rows_needed(workload: Workload, settings: BenchSettings) -> int:
    return (settings.steps_for(workload) + settings.warmup_steps) * settings.batch_for(workload)


def build_dataset(workload: Workload, settings: BenchSettings, tokenizer) -> Dataset:
    path = data_file(workload, settings)
    rows = rows_needed(workload, settings)
    seq = settings.seq_for(workload)
    if workload.task == "cls":
        return _classification(path, tokenizer, rows, seq, workload.padding)
    ids, special = _token_chunks(path, tokenizer, rows, seq)
    if workload.task == "mlm":
        return _masked(ids, special, tokenizer, settings.seed)
    labels = ids
    if workload.task == "lora":  # an instruction fine-tune's shape: the loss on the answer, not the prompt
        labels = ids.masked_fill(torch.arange(seq) < seq // 2, -100)
    # An explicit all-ones mask: decoder exports stay on the masked attention path.
    return Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(), "labels": labels.tolist()}
    )


def collator_for(workload: Workload, tokenizer):
    if workload.padding == "dynamic":
        return DataCollatorWithPadding(tokenizer)
    return default_data_collator


def _framing(tokenizer) -> tuple[list[int], list[int]]:
    """Special tokens around each chunk: [CLS] .. [SEP] for BERT-style tokenizers, BOS for
    decoder ones, none otherwise."""
    if tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None:
        return [tokenizer.cls_token_id], [tokenizer.sep_token_id]
    if tokenizer.bos_token_id is not None:
        return [tokenizer.bos_token_id], []
    return [], []


def _token_chunks(path: Path, tokenizer, rows: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated text in ``seq``-token chunks (run_mlm's group_texts), no padding; returns
    the ids and where the framing special tokens are."""
    head, tail = _framing(tokenizer)
    body = seq - len(head) - len(tail)
    ids: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("= "):
                ids.extend(tokenizer(line, add_special_tokens=False)["input_ids"])
            if len(ids) >= rows * body:
                break
    if len(ids) < body:
        raise DataMissing(f"{path} holds fewer than {body} tokens")
    chunks = [ids[i : i + body] for i in range(0, len(ids) - body + 1, body)]
    # Cycle when the file is short: the benchmark needs `rows` rows, not distinct ones.
    chunks = [head + chunks[i % len(chunks)] + tail for i in range(rows)]
    special = torch.zeros(rows, seq, dtype=torch.bool)
    special[:, : len(head)] = True
    special[:, seq - len(tail) :] = True
    return torch.tensor(chunks), special


def _masked(ids: torch.Tensor, special: torch.Tensor, tokenizer, seed: int) -> Dataset:
    """BERT masking (15%: 80% [MASK], 10% random, 10% kept), drawn once so every variant and
    round trains on the same batches."""
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no mask token: the mlm workload needs one")
    gen = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(ids.shape, generator=gen) < MASK_PROB) & ~special
    labels = ids.masked_fill(~chosen, -100)
    roll = torch.rand(ids.shape, generator=gen)
    inputs = ids.masked_fill(chosen & (roll < 0.8), tokenizer.mask_token_id)
    random_ids = torch.randint(len(tokenizer), ids.shape, generator=gen)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs = torch.where(swap, random_ids, inputs)
    return Dataset.from_dict(
        {"input_ids": inputs.tolist(), "attention_mask": torch.ones_like(ids).tolist(), "labels": labels.tolist()}
    )


def _classification(path: Path, tokenizer, rows: int, seq: int, padding: str) -> Dataset:
    table = read_table(path, rows)
    # Cycle when the file is short: the benchmark needs `rows` rows, not distinct ones.
    texts = [[column[i % len(column)] for i in range(rows)] for column in table.texts]
    labels = [table.labels[i % len(table.labels)] for i in range(rows)]
    pad = "max_length" if padding == "max_length" else False
    enc = tokenizer(*texts, truncation=True, max_length=seq, padding=pad)
    dataset = Dataset.from_dict({**enc, "labels": labels})
    return dataset.cast_column("labels", ClassLabel(names=table.label_names))


def num_labels(dataset: Dataset) -> int | None:
    """How many classes a classification dataset's labels name (None for other workloads)."""
    feature = dataset.features.get("labels")
    return feature.num_classes if isinstance(feature, ClassLabel) else None
