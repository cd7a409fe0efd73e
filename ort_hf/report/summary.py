"""The comparison-ready summary the example scripts print at the end of a run, and `--compare`."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SUMMARY_FILE = "ort_hf_summary.json"
ROWS = (
    ("engine", "engine"),
    ("run_samples_per_s", "samples/s (whole run)"),
    ("samples_per_s", "samples/s (window median)"),
    ("non_padding_tokens_per_s", "non-padding tokens/s"),
    ("peak_memory_mb", "peak memory MB (per step)"),
    ("run_peak_memory_mb", "peak memory MB (run)"),
    ("export_s", "ORT export s"),
    ("metric_value", "final metric"),
    ("label_sparsity", "label sparsity fired"),
    ("recompute", "recompute on"),
    ("embed_density", "embedding density"),
)


def _median(history: list[dict], key: str):
    values = [h[key] for h in history if key in h]
    return statistics.median(values) if values else None


def _first(history: list[dict], key: str):
    return next((h[key] for h in history if key in h), None)


def _last(history: list[dict], key: str):
    return next((h[key] for h in reversed(history) if key in h), None)


def run_summary(trainer, train_metrics: dict, eval_metrics: dict | None = None, metric_name: str | None = None) -> dict:
    """Numbers of one training run, from the Trainer's log history (the ort_hf callbacks' keys)."""
    history = trainer.state.log_history
    status = trainer.ort_engine_status() if hasattr(trainer, "ort_engine_status") else None
    if status is None:
        engine = "pytorch"
    else:
        engine = {"ort": "ort", "not_run": "not run"}.get(status.backend) or (
            f"pytorch (ORT fell back: {status.fallback_reason})"
            if status.fallback_reason
            else "pytorch (--use_ort auto measured it faster)"
        )
    peaks = [h["memory/peak_mb"] for h in history if "memory/peak_mb" in h]
    eval_metrics = eval_metrics or {}
    return {
        "engine": engine,
        "run_samples_per_s": _last(history, "throughput/run_samples_per_s"),
        "samples_per_s": _median(history, "throughput/samples_per_s") or train_metrics.get("train_samples_per_second"),
        "non_padding_tokens_per_s": _median(history, "tokens/non_padding_per_s"),
        "peak_memory_mb": max(peaks) if peaks else None,
        "run_peak_memory_mb": max(
            (h["memory/run_peak_mb"] for h in history if "memory/run_peak_mb" in h), default=None
        ),
        "export_s": _first(history, "ort/export_s"),
        "metric_name": metric_name,
        "metric_value": eval_metrics.get(metric_name) if metric_name else None,
        "label_sparsity": bool(_first(history, "ort/label_sparsity"))
        if _first(history, "ort/label_sparsity") is not None
        else None,
        "recompute": bool(_first(history, "memory/recompute"))
        if _first(history, "memory/recompute") is not None
        else None,
        "embed_density": _median(history, "density/embed"),
        "train_loss": train_metrics.get("train_loss"),
        # The whole run, as a stopwatch around train() sees it: the first step (ORT: export, gradient
        # graph, session) and the rest, for the break-even point (ort_hf.whole_run).
        "train_runtime_s": train_metrics.get("train_runtime"),
        "first_step_s": _first(history, "ort/first_step_s"),
        "steps": trainer.state.global_step,
    }


def write_summary(summary: dict, output_dir: str | Path) -> Path:
    path = Path(output_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))
    return path


def format_value(value) -> str:
    """A table cell: '-' for missing, 4 significant digits for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def format_summary(summary: dict) -> str:
    label = f"final metric ({summary.get('metric_name')})" if summary.get("metric_name") else "final metric"
    lines = ["", "=== ort_hf run summary ==="]
    for key, name in ROWS:
        lines.append(f"  {(label if key == 'metric_value' else name):<32} {format_value(summary.get(key))}")
    return "\n".join(lines)


def format_comparison(ort: dict, pytorch: dict) -> str:
    lines = [
        "",
        "=== ORT vs PyTorch (same script, same arguments, fresh process each) ===",
        f"  {'':<28} {'ORT':>14} {'PyTorch':>14} {'ORT/PyTorch':>12}",
    ]
    for key, name in ROWS[1:]:
        a, b = ort.get(key), pytorch.get(key)
        ratio = (
            a / b
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and not isinstance(a, bool)
            else None
        )
        lines.append(
            f"  {name:<28} {format_value(a):>14} {format_value(b):>14} {(f'{ratio:.2f}x' if ratio else '-'):>12}"
        )
    return "\n".join(lines + whole_run_lines(ort, pytorch))


def later_step_s(summary: dict) -> float | None:
    """The mean time of the steps after the first (the run's time less its first step)."""
    runtime, first, steps = summary.get("train_runtime_s"), summary.get("first_step_s"), summary.get("steps")
    if runtime is None or first is None or not steps or steps < 2:
        return None
    return (runtime - first) / (steps - 1)


def whole_run_lines(ort: dict, pytorch: dict) -> list[str]:
    """The whole run against PyTorch's (the first step included) and the break-even point."""
    from ..whole_run import break_even_steps, format_break_even

    ort_step, pytorch_step = later_step_s(ort), later_step_s(pytorch)
    if ort_step is None or pytorch_step is None:
        return []
    whole = pytorch["train_runtime_s"] / ort["train_runtime_s"]
    steps = break_even_steps(ort["first_step_s"], ort_step, pytorch["first_step_s"], pytorch_step)
    return [
        f"  {'first step s':<28} {ort['first_step_s']:>14.2f} {pytorch['first_step_s']:>14.2f}",
        f"  {'later steps, mean s':<28} {ort_step:>14.3f} {pytorch_step:>14.3f} {pytorch_step / ort_step:>11.2f}x",
        f"  {'whole run (train()) s':<28} {ort['train_runtime_s']:>14.1f} {pytorch['train_runtime_s']:>14.1f} "
        f"{whole:>11.2f}x",
        f"  {'whole run faster from step':<28} {format_break_even(steps):>14}",
        "  (time rows: the ratio is PyTorch's time over ORT's, above 1 where ORT is faster; the break-even point is "
        "the fewest steps for which ORT's first step plus its later steps take less time than PyTorch's)",
    ]


def _with_option(argv: list[str], name: str, value: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == name:
            skip = True
            continue
        if arg.startswith(name + "="):
            continue
        out.append(arg)
    return out + [name, value]


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def run_compare(script: str, argv: list[str]) -> int:
    """Run ``script`` with ``argv`` through ORT and through PyTorch, each in a fresh process,
    and print both summaries side by side with the ratio."""
    output_dir = _option(argv, "--output_dir")
    if not output_dir:
        print("--compare needs --output_dir (runs go to <output_dir>/ort and <output_dir>/pytorch)", file=sys.stderr)
        return 2
    summaries = {}
    for name, use_ort in (("ort", "true"), ("pytorch", "false")):
        run_argv = _with_option(_with_option(argv, "--output_dir", str(Path(output_dir) / name)), "--use_ort", use_ort)
        print(f"\n--- {name} run: {script} {' '.join(run_argv)}", flush=True)
        proc = subprocess.run([sys.executable, script, *run_argv], env=os.environ.copy())
        if proc.returncode != 0:
            print(f"--compare: the {name} run failed (exit {proc.returncode})", file=sys.stderr)
            return proc.returncode
        summaries[name] = json.loads((Path(output_dir) / name / SUMMARY_FILE).read_text())
    print(format_comparison(summaries["ort"], summaries["pytorch"]))
    return 0
