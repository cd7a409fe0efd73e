"""MLM batches from real WikiText-2 text, tokenized with the packaged MiniLM tokenizer, with
static (pre-computed, seeded) 15% masking so every run sees identical batches."""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import Dataset


def wikitext_mlm_dataset(shared_data: Path, tokenizer, rows: int = 64, seq: int = 32, seed: int = 0) -> Dataset:
    lines = []
    with open(shared_data / "wikitext-2-raw" / "wiki.valid.raw", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if len(line) > 80 and not line.startswith("="):
                lines.append(line)
            if len(lines) == rows:
                break
    enc = tokenizer(lines, truncation=True, max_length=seq, padding="max_length", return_tensors="pt")
    ids, attention = enc["input_ids"], enc["attention_mask"]
    gen = torch.Generator().manual_seed(seed)
    special = (ids == tokenizer.cls_token_id) | (ids == tokenizer.sep_token_id) | (attention == 0)
    chosen = (torch.rand(ids.shape, generator=gen) < 0.15) & ~special
    labels = ids.masked_fill(~chosen, -100)
    inputs = ids.masked_fill(chosen, tokenizer.mask_token_id)
    return Dataset.from_dict(
        {"input_ids": inputs.tolist(), "attention_mask": attention.tolist(), "labels": labels.tolist()}
    )


def tiny_bert_mlm(vocab_size: int, seed: int = 0, hidden_size: int = 64):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config)
