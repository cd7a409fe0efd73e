"""Per-step timing inside the Trainer loop, and batch counting."""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, two ways.

    ``cycles``: from the end of the previous step to the end of this one (the first from
    ``on_train_begin``), so everything the training loop does per step is in it: loading and
    collating the batch, forward, backward, clipping, optimizer, zero_grad, every callback and
    the previous step's logging. Throughput is computed from these: an outside observer timing
    the same loop (``train_runtime``, a stopwatch between log lines) sees the same.
    ``seconds``: ``on_step_begin`` to ``on_step_end`` only (the step's compute), to show how much
    of a cycle the rest of the loop takes."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.cycles: list[float] = []
        self._start = 0.0
        self._last_end = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_end = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.seconds.append(now - self._start)
        self.cycles.append(now - self._last_end)
        self._last_end = now


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


class ExportPeak:
    """The process's peak memory at the end of ORT's export trace (None without an export).

    The memory observer resets the peak when the first step begins, so the peak read when the
    trace leaves the model's forward covers the export alone: ORT's output-structure pass and
    the trace, before its gradient graph and session are built. Where the fused LM-head loss
    runs, the graph calls the model's backbone and not its forward: the backbone's end is read
    too, and the later of the two readings kept."""

    def __init__(self, model: torch.nn.Module) -> None:
        from ..callbacks.memory import ProcessMemory

        self.peak_mb: float | None = None
        self._memory = ProcessMemory()
        backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
        modules = [model] + ([backbone] if isinstance(backbone, torch.nn.Module) and backbone is not model else [])
        self._readings: dict[int, float] = {}  # the first trace's reading, per module
        self._handles = [m.register_forward_hook(self._at_forward_end) for m in modules]

    def _at_forward_end(self, module, args, output):
        if not torch.jit.is_tracing() or id(module) in self._readings:
            return
        self._readings[id(module)] = self._memory.peak_mb()
        self.peak_mb = max(self._readings.values())
        if len(self._readings) == len(self._handles):
            for handle in self._handles:
                handle.remove()
