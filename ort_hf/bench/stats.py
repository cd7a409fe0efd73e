"""Step-time statistics (no torch: the runner uses them too)."""

from __future__ import annotations

import statistics


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def step_stats(seconds: list[float]) -> dict[str, float]:
    return {
        "step_median_s": statistics.median(seconds),
        "step_p25_s": quantile(seconds, 0.25),
        "step_p75_s": quantile(seconds, 0.75),
        "step_min_s": min(seconds),
        "step_max_s": max(seconds),
    }
