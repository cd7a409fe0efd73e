"""--ort_compare_steps N and --use_ort auto: is ORT worth it for this run? Measured inside the run.

After the export step, N steps run through ORT and the next N in PyTorch (the same model,
weights and optimizer: one run), each timed from step begin to step end. Logged once: ORT's and
PyTorch's median step time, the speed-up, what the export cost (the first step's time beyond an
ORT step), the break-even point (the fewest steps for which ORT's whole run is the faster,
``ort_hf.whole_run``) and what that means for this run's length. Training then goes on through ORT, or,
with ``--use_ort auto``, on whichever engine was faster (PyTorch: the ORT session is freed).
Counted from the first step of each ``train()`` call, so a resumed run measures again.
"""

from __future__ import annotations

import logging
import statistics
import time

from transformers import TrainerCallback

from ..whole_run import break_even_steps, format_break_even, whole_run_s

logger = logging.getLogger(__name__)


class BreakEvenCallback(TrainerCallback):
    def __init__(self, trainer, steps: int):
        self.trainer, self.steps = trainer, steps
        self._first_step = 0
        self._start = 0.0
        self._first_step_s: float | None = None
        self._times: dict[str, list[float]] = {"ort": [], "pytorch": []}

    def on_train_begin(self, args, state, control, **kwargs):
        self._first_step, self._first_step_s = state.global_step, None
        self._times = {"ort": [], "pytorch": []}

    def _phase(self, index: int) -> str | None:
        """What the ``index``-th step of this train() call measures."""
        if index == 0:
            return "export"
        if index <= self.steps:
            return "ort"
        if index <= 2 * self.steps:
            return "pytorch"
        return None

    def on_step_begin(self, args, state, control, **kwargs):
        engine = self.trainer.ort_engine
        index = state.global_step - self._first_step
        if engine is not None and engine.engine_status().backend == "ort":
            if index == self.steps + 1:
                engine.use_pytorch(True)
            elif index == 2 * self.steps + 1:
                engine.use_pytorch(False)
                self._decide(engine, args.use_ort == "auto", state.max_steps - self._first_step, args)
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        phase, took = self._phase(state.global_step - 1 - self._first_step), time.perf_counter() - self._start
        if phase == "export":
            self._first_step_s = took
        elif phase in self._times:
            self._times[phase].append(took)

    def medians(self) -> tuple[float, float]:
        """Median step time (s) through ORT and in PyTorch."""
        return statistics.median(self._times["ort"]), statistics.median(self._times["pytorch"])

    def _decide(self, engine, auto: bool, total_steps: int, args) -> None:
        ort_s, pytorch_s = self.medians()
        first_s = max(self._first_step_s or 0.0, ort_s)
        export_s = first_s - ort_s
        saved = pytorch_s - ort_s
        # PyTorch's own first step is not measured in this run: its one-off cost counts as none.
        break_even = break_even_steps(first_s, ort_s, pytorch_s, pytorch_s)
        logs = {
            "ort/step_ms": round(1000 * ort_s, 2),
            "ort/pytorch_step_ms": round(1000 * pytorch_s, 2),
            "ort/speedup": round(pytorch_s / ort_s, 3),
            "ort/export_cost_s": round(export_s, 3),
            "ort/break_even_steps": float(break_even),
        }
        to_pytorch = auto and saved < 0
        if auto:
            logs["ort/auto_chose_pytorch"] = float(to_pytorch)
        self.trainer.add_ort_logs(logs)
        if to_pytorch:
            engine.finish_in_pytorch()
        if saved > 0:
            after = f"ORT's whole run is the faster from {format_break_even(break_even)} steps on"
        else:
            after = "ORT's whole run is never the faster: PyTorch's step is faster here"
        if total_steps > 0:
            ort_run, pytorch_run = (
                whole_run_s(first_s, ort_s, total_steps),
                whole_run_s(pytorch_s, pytorch_s, total_steps),
            )
            after += (
                f"; this run's {total_steps} steps at these rates: ORT {ort_run:.0f} s, PyTorch "
                f"{pytorch_run:.0f} s ({pytorch_run / ort_run:.2f}x)"
            )
        if saved > 0 and 0 < total_steps < break_even and not args.ort_export_cache_dir:
            after += "; --ort_export_cache_dir DIR lets the next run of this model load its exported graph"
        if auto:
            after += f"; --use_ort auto: the rest of the run trains {'in PyTorch' if to_pytorch else 'through ORT'}"
        elif saved <= 0:
            after += " (--use_ort false, or auto to switch by itself)"
        logger.warning(
            "ort_hf: measured in this run over %d steps each: ORT %.1f ms/step, PyTorch %.1f ms/step (%.2fx); the "
            "export cost %.2f s; %s.",
            self.steps,
            1000 * ort_s,
            1000 * pytorch_s,
            pytorch_s / ort_s,
            export_s,
            after,
        )
