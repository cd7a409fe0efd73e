"""Budget mode: the lightest recompute configuration whose measured peak fits the budget.

Rungs, lightest first: no recompute; the cheapest of the plans ORT found (elementwise
subgraphs, best bytes saved per unit of recompute cost); layer-wise recompute (level 1); level 1
plus compromised plans (level 2). Training starts on the heaviest rung (level 2), so the probing
steps stay under the budget whenever any rung can: a peak measured from outside the process is
what the budget is about. When the measured peak fits, ORT's own plan table (bytes each enabled
plan saves) estimates the peak of each lighter rung, and the trainer re-exports once to the
lightest rung estimated to fit with a 5% margin; if that rung's measured peak does not fit after
all, it goes back to the rung that did (a second re-export, the most there ever are).
With ``auto_find_batch_size``, a batch that does not fit even at level 2 is reported to the
Trainer as out of memory (weights and optimizer state restored first) and retried smaller
(accelerate's search): the largest batch that fits, with the lightest recompute for it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from transformers import TrainerCallback

from ..callbacks import MemoryObserverCallback

logger = logging.getLogger(__name__)

MAX_REEXPORTS = 2
START_LEVEL = 2  # budget mode's first rung: the heaviest, the lowest peak
MARGIN = 0.05  # a lighter rung is tried only when estimated at least 5% under the budget
_HEAVY_OPS = ("MatMul", "Gemm", "Conv", "Attention")  # recomputing these costs a GEMM
_OP_COST = {"Softmax": 5.0, "LayerNormalization": 5.0, "Gelu": 3.0, "Dropout": 3.0}


class BudgetExceeded(RuntimeError):
    """Raised (for ``auto_find_batch_size``) when no recompute configuration fits the budget.

    Its message contains " out of memory." so accelerate's batch-size search retries with a smaller batch."""


def plan_cost(plan: str, frequency: int) -> float | None:
    """Recompute cost of one plan (``cluster:strategy:count``) in rough elementwise-op units, or
    ``None`` for plans that recompute a matrix multiply or use a compromised strategy."""
    cluster = plan.partition(":")[0]
    ops = [op for op in cluster.split("+") if op]
    if _strategy(plan) != "1" or any(heavy in op for op in ops for heavy in _HEAVY_OPS):
        return None
    return max(frequency, 1) * sum(_OP_COST.get(op, 1.0) for op in ops)


def _strategy(plan: str) -> str:
    """The strategy field of a plan string ``cluster:strategy:count`` ("1" = plain recompute)."""
    return (plan.split(":") + [""])[1]


def cheap_plans(plans, excess_bytes: float) -> tuple[str, ...] | None:
    """The fewest cheap plans, best saving per cost first, whose saving covers ``excess_bytes``
    (with a 25% margin: ORT's estimate is of stashed bytes, not of the process peak)."""
    ranked = []
    for p in plans or []:
        cost = plan_cost(p.plan, p.frequency)
        if cost is not None and p.bytes_saved:
            ranked.append((p.bytes_saved / cost, p.plan, p.bytes_saved))
    chosen, saved = [], 0.0
    for _, plan, saving in sorted(ranked, reverse=True):
        chosen.append(plan)
        saved += saving
        if saved >= 1.25 * excess_bytes:
            return tuple(chosen)
    return None


class MemoryBudgetController(TrainerCallback):
    """Measures ``measure_steps`` steps after each export with the memory observer, starting on
    the heaviest rung, and moves to the lightest rung that fits ``budget_mb`` (see the module
    docstring); logs what it tried and chose."""

    def __init__(self, trainer, budget_mb: float, observer: MemoryObserverCallback, measure_steps: int = 2):
        self.trainer = trainer
        self.budget_mb = budget_mb
        self.observer = observer
        self.measure_steps = measure_steps
        self.history: list[dict] = []  # every configuration tried, across batch sizes
        self._snapshot = None
        self._reset()

    def _reset(self) -> None:
        self.done = False
        self.tried: list[dict] = []  # configurations tried at the current batch size
        self.reexports = 0
        self.fitting = None  # (options, peak) of the lightest rung measured to fit so far
        self.steps_at_rung = 0
        self.peaks: list[float] = []
        self.step_seconds: list[float] = []
        self._step_start = None

    # --- callback events --------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._reset()
        if args.auto_find_batch_size and self._snapshot is None:
            model = self.trainer.model
            self._snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.ort_engine
        if self.done or engine is None:
            return
        self.steps_at_rung += 1
        if self.steps_at_rung == 1:
            return  # the export (and session creation) step of this configuration
        self.peaks.append(self.observer.last_step_peak_mb)
        if self._step_start is not None:
            self.step_seconds.append(time.perf_counter() - self._step_start)
        if len(self.peaks) < self.measure_steps:
            return
        self._decide(args, engine)

    # --- the ladder ---------------------------------------------------------------------------
    def _decide(self, args, engine) -> None:
        options = engine.options
        peak = max(self.peaks)
        batch = self.trainer.state.train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
        seconds = sorted(self.step_seconds)[len(self.step_seconds) // 2] if self.step_seconds else None
        entry = {
            "batch_size": self.trainer.state.train_batch_size,
            "memory_opt_level": options.memory_opt_level,
            "memory_opt_plans": list(options.memory_opt_plans),
            "peak_mb": round(peak, 1),
            "samples_per_s": round(batch / seconds, 3) if seconds else None,
        }
        self.tried.append(entry)
        self.history.append(entry)
        if peak > self.budget_mb:
            if self.fitting is None:  # not even the heaviest rung fits
                return self._finish(fits=False, options=options, peak=peak)
            fitting, fitting_peak = self.fitting  # the lighter rung's estimate was wrong: go back
            engine.reconfigure(fitting)
            self.reexports += 1
            return self._finish(fits=True, options=fitting, peak=fitting_peak)
        self.fitting = (options, peak)
        lighter = self._lightest_estimated_fit(options, engine.memory_plans() or [], peak)
        if lighter is None or self.reexports >= MAX_REEXPORTS - 1:  # keep one re-export to go back
            return self._finish(fits=True, options=options, peak=peak)
        self.reexports += 1
        engine.reconfigure(lighter)
        self.steps_at_rung, self.peaks, self.step_seconds = 0, [], []

    def _lightest_estimated_fit(self, options, plans, peak_mb: float):
        """The lightest rung below the current one whose peak, estimated from ORT's plan table
        (the current peak plus the bytes saved by the enabled plans it would turn off), is at
        least MARGIN under the budget; None if there is none."""
        target = self.budget_mb * (1 - MARGIN)
        on = [p for p in plans if p.enabled]
        mb = 1 / 2**20
        no_recompute = peak_mb + sum(p.bytes_saved or 0 for p in on) * mb
        candidates = [(no_recompute, dataclasses.replace(options, memory_opt_level=0, memory_opt_plans=()))]
        chosen = cheap_plans(plans, (no_recompute - target) / mb) if no_recompute > target else None
        if chosen:
            saved = sum(p.bytes_saved or 0 for p in plans if p.plan in chosen) * mb
            candidates.append(
                (no_recompute - saved, dataclasses.replace(options, memory_opt_level=0, memory_opt_plans=chosen))
            )
        if options.memory_opt_level == 2:
            compromised = sum(p.bytes_saved or 0 for p in on if _strategy(p.plan) != "1") * mb
            candidates.append((peak_mb + compromised, dataclasses.replace(options, memory_opt_level=1)))
        current = _rung(options)
        for estimate, candidate in candidates:  # lightest first
            if _rung(candidate) < current and estimate <= target:
                return candidate
        return None

    def _finish(self, fits: bool, options, peak: float) -> None:
        self.done = True
        level, plans = options.memory_opt_level, options.memory_opt_plans
        chosen = f"recompute {describe(level, plans)}" if level or plans else "no recompute"
        tried = "; ".join(
            f"batch {t['batch_size']} {describe(t['memory_opt_level'], t['memory_opt_plans'])}: {t['peak_mb']:.0f} MB"
            + (f", {t['samples_per_s']:.2f} samples/s" if t["samples_per_s"] else "")
            for t in self.history
        )
        if not fits and self.trainer.args.auto_find_batch_size and self.trainer.state.train_batch_size > 1:
            self._restore_for_retry()
            logger.warning(
                "ort_hf: memory budget %.0f MB: batch %d does not fit at any recompute level "
                "(tried %s); retrying with a smaller batch.",
                self.budget_mb,
                self.trainer.state.train_batch_size,
                tried,
            )
            raise BudgetExceeded(
                f"ort_hf: measured peak above --ort_memory_budget_mb={self.budget_mb:.0f} at every recompute level "
                f"for batch {self.trainer.state.train_batch_size}: treated as out of memory."
            )
        logger.warning(
            "ort_hf: memory budget %.0f MB: %s (tried %s).",
            self.budget_mb,
            f"{chosen} fits at batch {self.trainer.state.train_batch_size} with a peak of {peak:.0f} MB"
            if fits
            else f"no recompute configuration fits (lowest peak {min(t['peak_mb'] for t in self.tried):.0f} MB); "
            "lower the batch size or add --auto_find_batch_size",
            tried,
        )
        self.trainer.add_ort_logs(
            {
                "memory/budget_level": float(options.memory_opt_level),
                "memory/budget_plans": float(len(options.memory_opt_plans)),
                "memory/budget_fits": float(fits),
                "memory/budget_batch_size": float(self.trainer.state.train_batch_size),
            }
        )

    def _restore_for_retry(self) -> None:
        # Steps already taken at the batch that does not fit must not leak into the retry.
        if self._snapshot is not None:
            self.trainer.model.load_state_dict(self._snapshot)
        optimizer = getattr(self.trainer.optimizer, "optimizer", self.trainer.optimizer)  # accelerate's wrapper
        if optimizer is not None:
            optimizer.state.clear()


def _rung(options) -> int:
    """0 no recompute, 1 chosen plans, 2 level 1, 3 level 2."""
    if options.memory_opt_level:
        return 1 + options.memory_opt_level
    return 1 if options.memory_opt_plans else 0


def describe(level: int, plans) -> str:
    """A recompute configuration, short: "level 1" or "plans a, b"."""
    return "plans " + ", ".join(plans) if plans else f"level {level}"
