"""Targets read from a TOML file (``ort-hf bench --targets FILE``) and checked against the rows of
one invocation: target, measured, met. The library holds no targets of its own; a project
writes its own file (this repository's is ``bench/targets.toml``).

Every key is optional; ``variant`` defaults to ``ort``::

    round_tolerance = 0.05      # a ratio target also needs every round within 5% of it

    [[speed]]                   # samples/s ratio to eager (median over rounds, and every round)
    workload = "sst2-dynamic"
    at_least = 1.1
    peak_at_most = 1.0          # optional: whole-run peak memory ratio to eager

    [[against]]                 # samples/s ratio to another variant of the same invocation
    workload = "mlm"
    variant = "ort"
    other = "masked-head"
    at_least = 1.0

    [every_workload]            # each workload's variant against eager
    at_least = 1.0

    [init]                      # ORT export + session build, from ORTModule's own banner
    workloads = ["mlm", "sst2-dynamic"]
    at_most_s = 5.0

    [loss]                      # final loss against eager's at the same step; dropout 0 only
    max_rel_diff = 0.01
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from .spec import BASELINE
from .summary import find_row, per_round_ratios


class BadTargets(ValueError):
    """The targets file cannot be read."""


def read_targets(path: str | Path) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadTargets(f"--targets {path}: {exc}") from None


def check_targets(spec: dict, rows: list[dict], dropout: float | None) -> list[dict]:
    """The targets of ``spec`` that this invocation measured (rows it did not run are left out)."""
    out: list[dict] = []
    tolerance = spec.get("round_tolerance", 0.0)

    def add(target, measured, met):
        out.append({"target": target, "measured": measured, "met": bool(met)})

    for goal in spec.get("speed", []):
        row = find_row(rows, goal["workload"], goal.get("variant", "ort"))
        if row and "speedup" in row:
            add(
                *_ratio_target(
                    f"{goal['workload']}: {row['variant']}",
                    "eager",
                    row["speedup"],
                    row.get("speedup_min", row["speedup"]),
                    goal["at_least"],
                    tolerance,
                )
            )
            if "peak_at_most" in goal and "run_peak_ratio" in row:
                add(
                    f"{goal['workload']}: {row['variant']} peak memory <= {goal['peak_at_most']:.2f}x eager's "
                    "(whole run)",
                    f"{row['run_peak_ratio']:.2f}x",
                    row["run_peak_ratio"] <= goal["peak_at_most"],
                )
    for goal in spec.get("against", []):
        row, other = (
            find_row(rows, goal["workload"], goal.get("variant", "ort")),
            find_row(rows, goal["workload"], goal["other"]),
        )
        if row and other:
            ratio = row["samples_per_s"] / other["samples_per_s"]
            low = min(per_round_ratios(row, other), default=ratio)
            add(
                *_ratio_target(
                    f"{goal['workload']}: {row['variant']}", goal["other"], ratio, low, goal["at_least"], tolerance
                )
            )
    every = spec.get("every_workload")
    if every:
        variant = every.get("variant", "ort")
        measured = [r for r in rows if r["variant"] == variant and r["status"] == "ok" and "speedup" in r]
        if measured:
            slowest = min(measured, key=lambda r: r["speedup"])
            add(
                f"no workload's {variant} below {every['at_least']:.2f}x eager (median)",
                f"slowest {slowest['workload']} {slowest['speedup']:.2f}x",
                slowest["speedup"] >= every["at_least"],
            )
    init = spec.get("init")
    if init:
        for workload in init.get("workloads", []):
            row = find_row(rows, workload, init.get("variant", "ort"))
            if row and row.get("ort_init_s") is not None:
                add(
                    f"{workload}: ORT export + session <= {init['at_most_s']:.0f} s",
                    f"{row['ort_init_s']:.1f} s (export {row['export_s']:.1f} s)",
                    row["ort_init_s"] <= init["at_most_s"],
                )
    loss = spec.get("loss")
    if loss and dropout == 0:  # with dropout on, each engine draws its own masks: losses differ by design
        worst = [r for r in rows if "final_loss_rel_diff" in r and r["variant"] != BASELINE]
        if worst:
            w = max(worst, key=lambda r: abs(r["final_loss_rel_diff"]))
            add(
                f"final loss within {loss['max_rel_diff']:.0%} of eager at the same step (all variants)",
                f"worst {abs(w['final_loss_rel_diff']):.1e} relative ({w['workload']} / {w['variant']})",
                abs(w["final_loss_rel_diff"]) <= loss["max_rel_diff"],
            )
    return out


def _ratio_target(
    who: str, other: str, median: float, lowest_round: float, at_least: float, tolerance: float
) -> tuple[str, str, bool]:
    floor = at_least * (1 - tolerance)
    text = f"{who} >= {at_least:.2f}x {other} samples/s"
    if tolerance:
        text += f", no round below {floor:.2f}x"
    measured = f"{median:.2f}x (lowest round {lowest_round:.2f}x)"
    return text, measured, median >= at_least and lowest_round >= floor
