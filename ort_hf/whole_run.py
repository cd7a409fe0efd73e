"""A whole run's arithmetic: ORT's first step costs more than eager's (export, gradient graph,
session), each later step less; after how many steps is ORT's whole run the faster one? One
definition for ``ort-hf bench``, ``--use_ort auto``'s log and the example scripts' comparisons.
No imports beyond the standard library: the bench's renderer uses it on stored results."""

from __future__ import annotations

import math


def break_even_steps(first_step_s: float, step_s: float, base_first_step_s: float, base_step_s: float) -> float:
    """The fewest steps (the first included) for which ``first_step_s + (N-1) * step_s`` is below
    ``base_first_step_s + (N-1) * base_step_s``: the run length from which the candidate (ORT) is
    faster whole than the baseline (eager). ``math.inf`` when that never comes (no saving per step)."""
    one_off = (first_step_s - step_s) - (base_first_step_s - base_step_s)  # the first step's cost beyond a steady step
    saved = base_step_s - step_s
    if saved <= 0:
        return 1.0 if one_off < 0 and saved == 0 else math.inf
    if one_off < 0:
        return 1.0
    return float(math.floor(one_off / saved) + 1)


def whole_run_s(first_step_s: float, step_s: float, steps: int) -> float:
    """A run of ``steps`` steps, its first at ``first_step_s``, the rest at ``step_s``."""
    return first_step_s + (steps - 1) * step_s


def format_break_even(steps: float) -> str:
    return "never" if math.isinf(steps) else f"{steps:.0f}"
