"""The benchmark's outputs: a markdown table, a JSON file and a PNG bar chart."""

from __future__ import annotations

import json
from pathlib import Path

from ..whole_run import format_break_even
from .cpu import describe, record_of
from .spec import BASELINE
from .summary import break_even


def _f(value, fmt="{:.2f}", missing="–"):
    return missing if value is None else fmt.format(value)


def _row_cells(r: dict, rows: list[dict]) -> list[str]:
    if r["status"] != "ok":
        return [r["workload"], r["variant"], r["status"].upper(), r.get("reason", "")] + [""] * (len(HEADER) - 4)
    speed = _f(r.get("speedup"), "{:.2f}x")
    if "speedup_min" in r and r["rounds_ok"] > 1:
        speed += f" ({r['speedup_min']:.2f}–{r['speedup_max']:.2f})"
    loss = f"{r['final_loss']:.4f} @{r['final_step']}"
    diff = "baseline" if r["variant"] == BASELINE else _f(r.get("final_loss_rel_diff"), "{:+.1e}")
    if r["variant"] != BASELINE and "curve_max_rel_diff" in r:
        diff += f" (curve max {r['curve_max_rel_diff']:.1e})"
    failed = f" ({r['rounds_failed']} failed)" if r["rounds_failed"] else ""
    return [
        r["workload"],
        r["variant"],
        r["engine"] + failed,
        f"{r['samples_per_s']:.2f} ({r['samples_per_s_min']:.2f}–{r['samples_per_s_max']:.2f})",
        speed,
        f"{r['tokens_per_s']:.0f}",
        f"{r['step_median_ms']:.0f} [{r['step_p25_ms']:.0f}–{r['step_p75_ms']:.0f}]",
        " / ".join(_f(r.get(k), "{:.0f}") for k in ("run_peak_mb", "first_step_peak_mb", "steady_peak_mb")),
        f"{_f(r['export_s'], '{:.1f}')} / {_f(r.get('export_peak_mb'), '{:.0f}')} / {_f(r['ort_init_s'], '{:.1f}')}",
        _f(r["first_step_s"], "{:.1f}"),
        _whole_run(r),
        "–" if (steps := break_even(r, rows)) is None else format_break_even(steps),
        loss,
        diff,
    ]


def _whole_run(r: dict) -> str:
    if r.get("train_runtime_s") is None:
        return "–"
    return f"{r['train_runtime_s']:.1f} ({_f(r.get('whole_run_speedup'), '{:.2f}x')})"


HEADER = [
    "workload",
    "variant",
    "engine",
    "samples/s median (min–max)",
    "vs eager (per-round range)",
    "non-pad tokens/s",
    "step ms median [IQR]",
    "peak RSS MB run / first step / steady",
    "export s / export peak MB / ORT init s",
    "first step s",
    "train() s (vs eager)",
    "whole run faster from step",
    "final loss @step",
    "loss rel. diff vs eager",
]


def markdown(rows: list[dict], targets: list[dict], conditions: dict) -> str:
    lines = ["# ort-hf bench", ""]
    cpu = record_of(conditions)
    if cpu is not None:  # every ratio below holds for this CPU kind only
        lines += [f"CPU: {describe(cpu)} (results folder {cpu['key']})", ""]
    lines += [f"- {key}: {value}" for key, value in conditions.items() if key != "cpu"]
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(_row_cells(r, rows)) + " |" for r in rows]
    lines += [
        "",
        "Columns: samples/s and tokens/s are over the measured steps (warm-up and export "
        "excluded), median over rounds; the ratio is to eager's median in this invocation, the range "
        "its per-round paired ratios. Step time pools all measured steps of all rounds; a step runs from "
        "the end of one optimizer step to the end of the next (data loading, callbacks and logging "
        "included). Run peak = memory/run_peak_mb (the whole process: loading, the export step, every "
        "step); first step = the first step's peak (ORT: export, session build and the step); steady = the "
        "largest per-step peak after warm-up. Peaks are resident memory (VmHWM); the memory observer "
        "resets that counter at each phase, so an outside /usr/bin/time -v of a worker sees only the "
        "peak since the last reset, less than these. Export = ort/export_s; export peak = the peak at the "
        "end of the export's trace (its output-structure pass and the trace); ORT init = export + session "
        "build, as ORTModule prints it. train() = the Trainer's train_runtime for the whole run, warm-up and "
        "the export or compilation in the first step included, median over rounds: what a stopwatch around "
        "trainer.train() sees. Its ratio (eager's time over this variant's) counts that one-off cost, which "
        "the steady ratio leaves out, so on a short run it is the lower of the two for ORT and compile. "
        "Whole run faster from step = the break-even point: the fewest steps (the first included) for "
        "which this variant's first step plus its median steps take less time than eager's; a run "
        "shorter than that is faster in eager ('never': no saving per step). "
        "With dropout on, each engine draws its own masks and the losses differ by that; --dropout 0 "
        "compares them.",
    ]
    sizes = [r for r in rows if r["variant"] == BASELINE and r.get("params_m")]
    if sizes:
        lines += [
            "",
            "Models: "
            + "; ".join(
                f"{r['workload']} {r['params_m']:.1f}M parameters ({r['trainable_params_m']:.2f}M trained)"
                for r in sizes
            )
            + ".",
        ]
    same = [r for r in rows if "vs_same_input" in r]
    if same:
        lines += [
            "",
            "Same input (the trim's share taken out): "
            + "; ".join(
                f"{r['workload']} {r['variant']} {r['vs_same_input']:.2f}x eager-trim "
                f"({r.get('vs_same_input_min', r['vs_same_input']):.2f}–{r.get('vs_same_input_max', r['vs_same_input']):.2f})"
                for r in same
            )
            + ". eager-trim's own ratio to eager is what dropping the all-padding columns buys.",
        ]
    if targets:
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'NO'} |" for t in targets]
    return "\n".join(lines) + "\n"


def write_json(path: Path, rows: list[dict], targets: list[dict], conditions: dict, results: list[dict]) -> None:
    path.write_text(json.dumps({"conditions": conditions, "rows": rows, "targets": targets, "runs": results}, indent=1))


def bar_chart(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(1, len(variants))
    panels = (("speedup", "samples/s vs eager (x)"), ("run_peak_mb", "peak RSS (MB)"))
    for ax, (key, title) in zip(axes, panels):
        for j, variant in enumerate(variants):
            xs, ys, errs = [], [], [[], []]
            for i, workload in enumerate(workloads):
                r = next((r for r in ok if r["workload"] == workload and r["variant"] == variant), None)
                if r is None or r.get(key) is None:
                    continue
                xs.append(i + (j - (len(variants) - 1) / 2) * width)
                ys.append(r[key])
                low, high = (
                    (r.get("speedup_min", r[key]), r.get("speedup_max", r[key]))
                    if key == "speedup"
                    else (r[key], r[key])
                )
                errs[0].append(max(0.0, r[key] - low))
                errs[1].append(max(0.0, high - r[key]))
            ax.bar(xs, ys, width, label=variant, yerr=errs if key == "speedup" else None, capsize=2)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(title)
        if key == "speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
