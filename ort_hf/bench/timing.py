"""Per-step timing inside the Trainer loop, and batch counting."""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, from ``on_step_begin`` to ``on_step_end``: forward,
    backward, clipping, optimizer and zero_grad. Batch loading happens before ``on_step_begin``
    (the Trainer prefetches the step's batches) and logging after ``on_step_end``, so neither
    is counted; both are identical across variants."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


class CountingCollator:
    """Wraps a collator and records (samples, non-padding tokens) of each batch, in order.

    With ``dataloader_num_workers=0`` the i-th collated batch is the i-th batch trained on,
    whatever the loader prefetches, so step i's counts are ``batches[i]``. Counting here
    rather than in a forward hook keeps torch.compile's graph free of Python side effects."""

    def __init__(self, collate):
        self.collate = collate
        self.batches: list[tuple[int, int]] = []

    def __call__(self, features):
        batch = self.collate(features)
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        tokens = int(mask.sum()) if torch.is_tensor(mask) else ids.numel()
        self.batches.append((int(ids.shape[0]), tokens))
        return batch
