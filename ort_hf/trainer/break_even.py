"""--ort_compare_steps N: is ORT worth it for this run? Measured inside the run itself.

After the export step, N steps run through ORT and the next N in PyTorch (the same model,
weights and optimizer: one run), each timed from step begin to step end; then training goes on
through ORT. Logged once: ORT's and PyTorch's median step time, the speed-up, what the export
cost (the first step's time beyond an ORT step) and after how many steps ORT has paid for it.
"""

from __future__ import annotations

import logging
import math
import statistics
import time

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class BreakEvenCallback(TrainerCallback):
    def __init__(self, trainer, steps: int):
        self.trainer, self.steps = trainer, steps
        self._start = 0.0
        self._first_step_s: float | None = None
        self._times: dict[str, list[float]] = {"ort": [], "pytorch": []}

    def _phase(self, completed: int) -> str | None:
        if completed == 0:
            return "export"
        if completed <= self.steps:
            return "ort"
        if completed <= 2 * self.steps:
            return "pytorch"
        return None

    def on_step_begin(self, args, state, control, **kwargs):
        engine = self.trainer._ort_engine_module
        if engine is None:
            return
        if state.global_step == self.steps + 1:
            engine.use_pytorch(True)
        elif state.global_step == 2 * self.steps + 1:
            engine.use_pytorch(False)
            self._report()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        phase, took = self._phase(state.global_step - 1), time.perf_counter() - self._start
        if phase == "export":
            self._first_step_s = took
        elif phase in self._times:
            self._times[phase].append(took)

    def _report(self) -> None:
        ort_s, pytorch_s = (statistics.median(self._times[k]) for k in ("ort", "pytorch"))
        export_s = max(0.0, (self._first_step_s or 0.0) - ort_s)
        saved = pytorch_s - ort_s
        break_even = math.ceil(export_s / saved) if saved > 0 else math.inf
        self.trainer._pending_ort_logs.update({
            "ort/step_ms": round(1000 * ort_s, 2), "ort/pytorch_step_ms": round(1000 * pytorch_s, 2),
            "ort/speedup": round(pytorch_s / ort_s, 3), "ort/export_cost_s": round(export_s, 3),
            "ort/break_even_steps": float(break_even),
        })
        logger.warning(
            "ort_hf: measured in this run over %d steps each: ORT %.1f ms/step, PyTorch %.1f ms/step (%.2fx); the "
            "export cost %.2f s, %s.", self.steps, 1000 * ort_s, 1000 * pytorch_s, pytorch_s / ort_s, export_s,
            f"paid back after {break_even} steps" if saved > 0 else "never paid back: PyTorch is faster here "
            "(--use_ort false)")
