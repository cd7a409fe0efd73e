"""Budget mode: the lightest recompute configuration whose measured peak fits the budget."""

from __future__ import annotations

import dataclasses
import logging

from transformers import TrainerCallback

from ..callbacks import MemoryObserverCallback

logger = logging.getLogger(__name__)

LADDER = (0, 1, 2)  # memory optimizer levels, lightest first: at most two re-exports


class MemoryBudgetController(TrainerCallback):
    """Measures ``measure_steps`` steps after the export step with the memory observer; while the
    per-step peak is over ``budget_mb``, re-exports with the next recompute level (1, then 2)."""

    def __init__(self, trainer, budget_mb: float, observer: MemoryObserverCallback, measure_steps: int = 2):
        self.trainer = trainer
        self.budget_mb = budget_mb
        self.observer = observer
        self.measure_steps = measure_steps
        self.level_index = 0
        self.steps_at_level = 0
        self.peaks: list[float] = []
        self.done = False
        self.tried: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer._ort_engine_module
        if self.done or engine is None:
            return
        self.steps_at_level += 1
        if self.steps_at_level == 1:
            return  # the export (and session creation) step of this configuration
        self.peaks.append(self.observer.last_step_peak_mb)
        if len(self.peaks) < self.measure_steps:
            return
        peak = max(self.peaks)
        level = engine.options.memory_opt_level
        self.tried.append({"memory_opt_level": level, "peak_mb": round(peak, 1)})
        if peak <= self.budget_mb or self.level_index == len(LADDER) - 1:
            self.done = True
            fits = peak <= self.budget_mb
            logger.warning(
                "ort_hf: memory budget %.0f MB: %s (tried %s).", self.budget_mb,
                f"recompute level {level} fits with a peak of {peak:.0f} MB" if fits
                else f"no recompute level fits (lowest peak {min(t['peak_mb'] for t in self.tried):.0f} MB); "
                "lower the batch size or use --auto_find_batch_size",
                ", ".join(f"level {t['memory_opt_level']}: {t['peak_mb']:.0f} MB" for t in self.tried),
            )
            self.trainer._pending_ort_logs["memory/budget_level"] = float(level)
            self.trainer._pending_ort_logs["memory/budget_fits"] = float(fits)
            return
        self.level_index += 1
        options = dataclasses.replace(engine.options, memory_opt_level=LADDER[self.level_index], memory_opt_plans=())
        engine.reconfigure(options)
        self.steps_at_level, self.peaks = 0, []
