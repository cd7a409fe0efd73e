"""`ort-hf report RUN_DIR [RUN_DIR ...]`: PNG charts and a markdown summary from trainer_state.json.

Reads the log history the Trainer writes (with the ort_hf callbacks' keys) and draws each
run as one line per chart, so an ORT run and a PyTorch run compare at a glance.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from .summary import format_value

# Charts of amounts (memory, throughput) start at zero; loss and density keep matplotlib's range.
ZERO_BASED = ("throughput.png", "memory.png")
CHARTS = {
    "loss.png": ("Training loss", [("loss", "loss")]),
    "throughput.png": (
        "Throughput (export and warm-up steps excluded)",
        [("throughput/samples_per_s", "samples/s"), ("tokens/non_padding_per_s", "non-padding tokens/s")],
    ),
    "memory.png": (
        "Peak memory per phase (MB)",
        [
            ("memory/forward_peak_mb", "forward"),
            ("memory/backward_peak_mb", "backward"),
            ("memory/optimizer_peak_mb", "optimizer"),
            ("memory/peak_mb", "step peak"),
        ],
    ),
    "density.png": ("Input density", [("density/embed", "embedding input"), ("density/label", "labels")]),
}


@dataclass
class Run:
    name: str
    history: list[dict]

    def series(self, key: str) -> tuple[list[int], list[float]]:
        points = [(h["step"], h[key]) for h in self.history if key in h and "step" in h]
        return [p[0] for p in points], [p[1] for p in points]

    def values(self, key: str) -> list[float]:
        return self.series(key)[1]

    def first(self, key: str):
        return next((h[key] for h in self.history if key in h), None)


def load_run(path: str | Path) -> Run:
    """A run from its output dir (or a checkpoint dir, or the trainer_state.json itself)."""
    path = Path(path)
    state_file = path if path.is_file() else path / "trainer_state.json"
    if not state_file.exists():
        checkpoints = sorted(
            path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1])
        )
        if not checkpoints:
            raise FileNotFoundError(
                f"No trainer_state.json in {path} or its checkpoints: pass a Trainer output_dir "
                "(call trainer.save_state() at the end of training, or enable checkpoints)."
            )
        state_file = checkpoints[-1]
    with open(state_file) as f:
        history = json.load(f)["log_history"]
    name = path.name if path.is_dir() else path.parent.name
    return Run(name=name, history=history)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(run: Run) -> dict[str, float | None]:
    losses = run.values("loss")
    return {
        "steps": max((h.get("step", 0) for h in run.history), default=0),
        "final loss": losses[-1] if losses else None,
        "samples/s (whole run)": (run.values("throughput/run_samples_per_s") or [None])[-1],
        "samples/s (median)": _median(run.values("throughput/samples_per_s")),
        "non-padding tokens/s (median)": _median(run.values("tokens/non_padding_per_s")),
        "peak memory MB (per step, max)": max(run.values("memory/peak_mb"), default=None),
        "embedding density (mean)": statistics.fmean(run.values("density/embed"))
        if run.values("density/embed")
        else None,
        "label density (mean)": statistics.fmean(run.values("density/label")) if run.values("density/label") else None,
        "ORT export s": run.first("ort/export_s"),
        "ORT label sparsity": run.first("ort/label_sparsity"),
        "ORT loss in graph": run.first("ort/loss_in_graph"),
        "ORT fallback": run.first("ort/fallback"),
    }


def _markdown(runs: list[Run], charts: list[str]) -> str:
    summaries = [summarize(r) for r in runs]
    header = "| metric | " + " | ".join(r.name for r in runs)
    if len(runs) > 1:
        header += f" | {runs[1].name} / {runs[0].name}"
    lines = ["# Training report", "", header + " |", "|---" * (len(runs) + 1 + (len(runs) > 1)) + "|"]
    for key in summaries[0]:
        row = [format_value(s[key]) for s in summaries]
        if len(runs) > 1:
            a, b = summaries[0][key], summaries[1][key]
            ratio = b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
            row.append(f"{ratio:.2f}x" if ratio is not None else "-")
        lines.append(f"| {key} | " + " | ".join(row) + " |")
    lines += ["", "Charts: " + ", ".join(f"[{c}]({c})" for c in charts), ""]
    return "\n".join(lines)


def render_report(run_dirs: list[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write the charts and ``report.md`` into ``out_dir`` (default: ``<first run>/report``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(d) for d in run_dirs]
    out = Path(out_dir) if out_dir else Path(run_dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, (title, keys) in CHARTS.items():
        present = [(k, label) for k, label in keys if any(r.values(k) for r in runs)]
        if not present:
            continue
        cols = min(2, len(present))
        rows = (len(present) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.6 * rows), squeeze=False)
        for ax in axes.flat[len(present) :]:
            ax.set_visible(False)
        for ax, (key, label) in zip(axes.flat, present):
            for run in runs:
                steps, values = run.series(key)
                if values:
                    ax.plot(steps, values, marker="." if len(values) < 50 else None, label=run.name)
            ax.set_title(label)
            if filename in ZERO_BASED:
                ax.set_ylim(bottom=0)  # a 2% difference must not look like a 2x one
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out / filename, dpi=100)
        plt.close(fig)
        written.append(filename)
    (out / "report.md").write_text(_markdown(runs, written))
    return out
