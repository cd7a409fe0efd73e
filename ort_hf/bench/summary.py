"""From worker results to one row per (workload, variant), with ratios to the baseline measured
in the same invocation, and loss agreement."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from ..whole_run import break_even_steps
from .spec import BASELINE, VARIANTS
from .stats import quantile


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _loss_at(losses: list, step: int) -> float | None:
    return next((loss for s, loss in losses if s == step), None)


def summarize(results: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        if r.get("variant") is not None:
            groups[(r["workload"], r["variant"])].append(r)
    rows = [_row(workload, variant, runs) for (workload, variant), runs in groups.items()]
    base = {row["workload"]: row for row in rows if row["variant"] == BASELINE and row["status"] == "ok"}
    for row in rows:
        _compare(row, base.get(row["workload"]))
        _compare_same_input(row, rows)
        if (steps := break_even(row, rows)) is not None:
            row["break_even_steps"] = None if math.isinf(steps) else steps  # None: never (JSON has no inf)
    return rows


def break_even(row: dict, rows: list[dict]) -> float | None:
    """The fewest steps for which ``row``'s whole run beats eager's (``ort_hf.whole_run``): from
    each one's first step (ORT: export, gradient graph, session and the step) and median step.
    Computed from stored rows, so results written before this figure existed render it too."""
    base = find_row(rows, row["workload"], BASELINE)
    if (
        row["status"] != "ok"
        or base is None
        or row is base
        or row.get("first_step_s") is None
        or base.get("first_step_s") is None
    ):
        return None
    return break_even_steps(
        row["first_step_s"], row["step_median_ms"] / 1000, base["first_step_s"], base["step_median_ms"] / 1000
    )


def _compare_same_input(row: dict, rows: list[dict]) -> None:
    """ORT against eager fed the same trimmed batches (``eager-trim``), where that variant ran:
    what ORT's engine buys on padded data, apart from what the trim buys."""
    trim = find_row(rows, row["workload"], "eager-trim")
    if trim is None or row["status"] != "ok" or not VARIANTS[row["variant"]].use_ort:
        return
    row["vs_same_input"] = row["samples_per_s"] / trim["samples_per_s"]
    paired = per_round_ratios(row, trim)
    if paired:
        row["vs_same_input_min"], row["vs_same_input_max"] = min(paired), max(paired)


def _row(workload: str, variant: str, runs: list[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    row = {
        "workload": workload,
        "variant": variant,
        "rounds_ok": len(ok),
        "rounds_failed": len(runs) - len(ok),
        "status": "ok" if ok else runs[0]["status"],
    }
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        row["reason"] = failed[0]["reason"]
    if not ok:
        return row
    steps = [t for r in ok for t in r["step_times_s"]]
    first = ok[0]
    row.update(
        engine="/".join(sorted({r["engine"] for r in ok})),
        samples_per_s=_median([r["samples_per_s"] for r in ok]),
        samples_per_s_min=min(r["samples_per_s"] for r in ok),
        samples_per_s_max=max(r["samples_per_s"] for r in ok),
        samples_per_s_by_round={str(r["round"]): r["samples_per_s"] for r in ok},
        tokens_per_s=_median([r["tokens_per_s"] for r in ok]),
        step_median_ms=1000 * statistics.median(steps),
        step_p25_ms=1000 * quantile(steps, 0.25),
        step_p75_ms=1000 * quantile(steps, 0.75),
        step_min_ms=1000 * min(steps),
        step_max_ms=1000 * max(steps),
        params_m=first.get("params_m"),
        trainable_params_m=first.get("trainable_params_m"),
        run_peak_mb=_median([r.get("run_peak_mb") for r in ok]),
        first_step_peak_mb=_median([r.get("first_step_peak_mb") for r in ok]),
        export_peak_mb=_median([r.get("export_peak_mb") for r in ok]),
        steady_peak_mb=_median([r.get("steady_peak_mb") for r in ok]),
        export_s=_median([r.get("export_s") for r in ok]),
        ort_init_s=_median([r.get("ort_init_s") for r in ok]),
        first_step_s=_median([r.get("first_step_s") for r in ok]),
        train_runtime_s=_median([r.get("train_runtime_s") for r in ok]),
        label_sparsity=first.get("label_sparsity"),
        loss_in_graph=first.get("loss_in_graph"),
        final_step=first["final_step"],
        final_loss=first["final_loss"],
        # Same seed, same batches: every round of a variant should give the same losses.
        final_loss_spread=max(r["final_loss"] for r in ok) - min(r["final_loss"] for r in ok),
        losses=first["losses"],
    )
    return row


def _compare(row: dict, base: dict | None) -> None:
    if row["status"] != "ok" or base is None:
        return
    row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
    paired = per_round_ratios(row, base)
    if paired:
        row["speedup_min"], row["speedup_max"] = min(paired), max(paired)
    if row.get("train_runtime_s") and base.get("train_runtime_s"):
        # Every variant trains the same steps on the same batches: the time ratio is the throughput ratio.
        row["whole_run_speedup"] = base["train_runtime_s"] / row["train_runtime_s"]
    for peak in ("run_peak_mb", "first_step_peak_mb", "steady_peak_mb"):
        if row.get(peak) and base.get(peak):
            row[peak.replace("_mb", "_ratio")] = row[peak] / base[peak]
    ref = _loss_at(base["losses"], row["final_step"])
    if ref:
        row["final_loss_rel_diff"] = (row["final_loss"] - ref) / abs(ref)
    diffs = [abs(loss - b) / abs(b) for s, loss in row["losses"] if (b := _loss_at(base["losses"], s))]
    if diffs:
        row["curve_max_rel_diff"] = max(diffs)


def find_row(rows: list[dict], workload: str, variant: str) -> dict | None:
    """The successful row of ``variant`` on ``workload``, if any."""
    return next(
        (r for r in rows if r["workload"] == workload and r["variant"] == variant and r["status"] == "ok"), None
    )


def per_round_ratios(row: dict, other: dict) -> list[float]:
    """``row``'s samples/s over ``other``'s, round by round (each round ran every variant back to back)."""
    mine, theirs = row.get("samples_per_s_by_round", {}), other.get("samples_per_s_by_round", {})
    return [mine[r] / theirs[r] for r in mine if r in theirs]
