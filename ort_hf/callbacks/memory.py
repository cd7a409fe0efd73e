"""MemoryObserverCallback: peak memory per training phase, in the Trainer's logs.

On CPU the numbers are the process's resident memory: its peak (``VmHWM``) is reset at each
phase boundary through ``/proc/self/clear_refs`` so each phase gets its own peak. A sampling
thread would miss peaks (ORT holds the GIL), which the kernel's high-water mark does not.
On CUDA they come from torch's allocator (allocated, reserved, peak allocated); ORT's CUDA
allocations go through torch's allocator when ORT uses the external allocator (its default).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import torch

from .observer import BatchObserver, all_reduce_sum

logger = logging.getLogger(__name__)
MB = 1024 * 1024
PHASES = ("forward", "backward", "optimizer")


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class ProcessMemory:
    """Current and peak memory of this process (CUDA allocator on GPU, kernel RSS on CPU)."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        # Checked without writing: a reset here would lose the peak of what ran before (loading).
        self.can_reset = self.cuda or os.access("/proc/self/clear_refs", os.W_OK)
        if not self.can_reset:
            logger.warning("ort_hf: /proc/self/clear_refs is not writable: phase peaks are peaks since start.")

    @staticmethod
    def _try_reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            return True
        except OSError:
            return False

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        elif self.can_reset:
            self.can_reset = self._try_reset()

    def peak_mb(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / MB
        return (_status_kb("VmHWM") or 0) / 1024

    def current_mb(self) -> float:
        if self.cuda:
            return torch.cuda.memory_allocated() / MB
        return (_status_kb("VmRSS") or 0) / 1024

    def reserved_mb(self) -> float | None:
        return torch.cuda.memory_reserved() / MB if self.cuda else None


@dataclass
class StepMemory:
    peaks: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    start_mb: float = 0.0

    @property
    def peak(self) -> float:
        return max(self.peaks.values())


class MemoryObserverCallback(BatchObserver):
    """Logs ``memory/peak_mb`` (per-step peak, max over the logging window), ``memory/rss_mb``
    (or allocated on CUDA), ``memory/<phase>_peak_mb`` for forward, backward and optimizer,
    ``memory/run_peak_mb``, and ``memory/recompute`` (ORT memory optimizer on or off).

    The first ``skip_steps`` steps (ORT export and session creation, warm-up) are left out of
    the per-step figures and reported once as ``ort/export_peak_mb`` and ``ort/first_step_s``.
    Note: on CPU this resets the process's VmHWM at every phase; ``memory/run_peak_mb`` is the
    peak of the whole process up to that log: loading, every step, evaluation and checkpoint
    writes included (the high-water mark is read before each reset).
    """

    def __init__(self, skip_steps: int = 1):
        super().__init__()
        self.skip_steps = skip_steps
        self.memory: ProcessMemory | None = None
        self._step = StepMemory()
        self._window: list[StepMemory] = []
        self._run_peak = 0.0
        self._phase = "forward"
        self._step_start = 0.0
        self._first: dict[str, float] = {}
        self._recompute = 0.0
        self.last_step_peak_mb = 0.0

    def _fold_run_peak(self) -> None:
        """The high-water mark since the last reset into the run's peak (reading does not reset)."""
        if self.memory is not None:
            self._run_peak = max(self._run_peak, self.memory.peak_mb())

    def on_train_begin(self, args, state, control, **kwargs):
        self.memory = ProcessMemory()
        self._fold_run_peak()  # loading the model and data, before the first reset
        level = getattr(args, "ort_memory_opt_level", 0)
        plans = getattr(args, "ort_memory_opt_plans", None)
        self._recompute = float(getattr(args, "use_ort", False) and bool(level or plans))
        super().on_train_begin(args, state, control, **kwargs)

    def _close_phase(self, next_phase: str) -> None:
        if self.memory is None:
            return
        peak = self.memory.peak_mb()
        self._step.peaks[self._phase] = max(self._step.peaks[self._phase], peak)
        self._run_peak = max(self._run_peak, peak)
        self.memory.reset_peak()
        self._phase = next_phase

    def on_step_begin(self, args, state, control, **kwargs):
        if self.memory is None:
            return
        self._fold_run_peak()  # what ran since the last step: evaluation, checkpoint writes, loading
        self.memory.reset_peak()
        self._step = StepMemory(start_mb=self.memory.current_mb())
        self._phase = "forward"
        self._step_start = time.perf_counter()

    def before_forward(self, inputs: dict) -> None:
        if self._phase != "forward":  # a later micro-batch: its backward phase ended here
            self._close_phase("forward")

    def after_forward(self) -> None:
        self._close_phase("backward")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._close_phase("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        self._close_phase("forward")
        self.last_step_peak_mb = self._step.peak
        if state.global_step <= self.skip_steps:
            self._first = {
                "ort/export_peak_mb": round(self._step.peak, 1),
                "ort/first_step_s": round(time.perf_counter() - self._step_start, 3),
            }
            return
        self._window.append(self._step)

    def collect(self, args, state, logs: dict) -> dict:
        if self.memory is None:
            return {}
        out = dict(self._first)
        self._first = {}
        if self._window:
            values = [max(s.peak for s in self._window)] + [max(s.peaks[p] for s in self._window) for p in PHASES]
            world = max(1, args.world_size)
            values = [v / world for v in all_reduce_sum(values)]  # mean over ranks
            out["memory/peak_mb"] = round(values[0], 1)
            for phase, value in zip(PHASES, values[1:]):
                out[f"memory/{phase}_peak_mb"] = round(value, 1)
        out["memory/rss_mb" if not self.memory.cuda else "memory/allocated_mb"] = round(self.memory.current_mb(), 1)
        if self.memory.cuda:
            out["memory/reserved_mb"] = round(self.memory.reserved_mb(), 1)
        self._fold_run_peak()
        out["memory/run_peak_mb"] = round(self._run_peak, 1)
        out["memory/recompute"] = self._recompute
        self._window = []
        return out
