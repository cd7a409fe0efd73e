"""Results of several CPU kinds side by side: ``ort-hf bench --out DIR`` writes each invocation to
``DIR/<cpu key>/`` (``cpu.py``), so a run on another CPU kind adds a folder beside the others
instead of replacing them, and ``DIR/by-cpu.md`` shows every ratio with a column per CPU kind and
each kind's targets checked on its own results."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..whole_run import format_break_even
from .cpu import describe, record_of
from .spec import BASELINE
from .summary import break_even
from .targets import check_targets

BY_CPU_FILE = "by-cpu.md"


def load_results(out: Path) -> list[tuple[dict, dict]]:
    """(CPU record, bench.json) of every ``out/<cpu key>/bench.json``, in folder order."""
    found = []
    for path in sorted(Path(out).glob("*/bench.json")):
        report = json.loads(path.read_text())
        record = record_of(report["conditions"]) or {
            "model": path.parent.name,
            "capability": "?",
            "cores": "?",
            "key": path.parent.name,
        }
        found.append((record, report))
    return found


def _cell(row: dict | None, rows: list[dict]) -> str:
    if row is None or row["status"] != "ok" or row.get("speedup") is None:
        return "–" if row is None else row["status"]
    text = f"{row['speedup']:.2f}x"
    if "speedup_min" in row and row.get("rounds_ok", 1) > 1:
        text += f" ({row['speedup_min']:.2f}–{row['speedup_max']:.2f})"
    steps = break_even(row, rows)
    if steps is not None:
        text += "; whole run " + (
            "never faster" if math.isinf(steps) else f"faster from step {format_break_even(steps)}"
        )
    return text


def markdown_by_cpu(results: list[tuple[dict, dict]], spec: dict | None = None) -> str:
    """Every (workload, variant)'s ratio to eager per CPU kind, then each kind's conditions and targets
    (checked against ``spec`` when given, else the targets stored with its results)."""
    lines = [
        "# ort-hf bench, by CPU kind",
        "",
        (
            "Each column is one CPU kind's `ort-hf bench` (its folder beside this file): samples/s against eager "
            "measured on that CPU, median (per-round range), and the break-even point (the fewest steps from "
            "which the variant's whole run, first step included, is faster than eager's). A ratio holds for "
            "its CPU kind only. A kind named without its /proc/cpuinfo family was measured before the family "
            "was recorded (docs/benchmarks.md names it)."
        ),
        "",
    ]
    cpus = [describe(record) for record, _ in results]
    lines += ["| workload | variant | " + " | ".join(cpus) + " |", "|---|---|" + "---|" * len(cpus)]
    pairs = list(
        dict.fromkeys(
            (r["workload"], r["variant"]) for _, report in results for r in report["rows"] if r["variant"] != BASELINE
        )
    )
    for workload, variant in pairs:
        cells = []
        for _, report in results:
            row = next((r for r in report["rows"] if r["workload"] == workload and r["variant"] == variant), None)
            cells.append(_cell(row, report["rows"]))
        lines.append(f"| {workload} | {variant} | " + " | ".join(cells) + " |")
    for record, report in results:
        conditions = report["conditions"]
        lines += [
            "",
            f"## {describe(record)}",
            "",
            (
                f"Folder `{record['key']}/`; `{conditions.get('command', '?')}`, {conditions.get('date', '?')}, "
                f"tree {conditions.get('tree', '?')}."
            ),
        ]
        goals = report.get("targets", [])
        if spec:
            goals = check_targets(spec, report["rows"], _dropout(conditions))
        if goals:
            lines += ["", "| target | measured | met |", "|---|---|---|"]
            lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'NO'} |" for t in goals]
    return "\n".join(lines) + "\n"


def _dropout(conditions: dict) -> float | None:
    """The run's --dropout, from its settings line ("dropout model default" or "dropout 0.0")."""
    settings = conditions.get("settings", "")
    for part in settings.split(", "):
        if part.startswith("dropout "):
            value = part.removeprefix("dropout ")
            try:
                return float(value)
            except ValueError:
                return None
    return None


def write_by_cpu(out: Path, spec: dict | None = None) -> Path | None:
    """``out/by-cpu.md`` from every CPU kind's results in ``out`` (None when there are none)."""
    results = load_results(out)
    if not results:
        return None
    path = Path(out) / BY_CPU_FILE
    path.write_text(markdown_by_cpu(results, spec))
    return path
