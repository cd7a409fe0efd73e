"""`ort-hf report` renders charts and a summary from two runs' trainer_state.json (canned here: the
callbacks' own numbers in real logs are tests/callbacks/test_callbacks_in_training.py's)."""

import json
import math
import subprocess
import sys

from ort_hf.report import load_run


def _state(out, ort: bool) -> None:
    """A trainer_state.json as ORTTrainer writes it: the callbacks' keys in every training log,
    ORT's one-time facts in the first."""
    history = []
    for step in range(2, 10, 2):
        logs = {
            "step": step,
            "epoch": step / 8,
            "loss": 0.7 - 0.02 * step + (0.001 if ort else 0.0),
            "throughput/samples_per_s": (60.0 if ort else 50.0) + step,
            "throughput/run_samples_per_s": (60.0 if ort else 50.0) + step / 2,
            "tokens/non_padding_per_s": 900.0 + step,
            "memory/peak_mb": 700.0 + step,
            "memory/forward_peak_mb": 650.0,
            "memory/backward_peak_mb": 690.0,
            "memory/optimizer_peak_mb": 600.0,
            "memory/run_peak_mb": 720.0,
            "density/embed": 0.3 + 0.01 * math.sin(step),
            "density/label": 1.0,
        }
        if ort and step == 2:
            logs.update({"ort/export_s": 1.5, "ort/fallback": 0.0, "ort/label_sparsity": 0.0, "ort/loss_in_graph": 1.0})
        history.append(logs)
    out.mkdir(parents=True)
    (out / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 8}))


def test_report_from_two_runs(tmp_path):
    _state(tmp_path / "ort", ort=True)
    _state(tmp_path / "pytorch", ort=False)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ort_hf.cli",
            "report",
            str(tmp_path / "ort"),
            str(tmp_path / "pytorch"),
            "--out",
            str(tmp_path / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("loss.png", "throughput.png", "memory.png", "density.png"):
        png = tmp_path / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
    summary = (tmp_path / "report" / "report.md").read_text()
    assert "| metric | ort | pytorch | pytorch / ort |" in summary
    assert "embedding density (mean)" in summary and "ORT export s" in summary
    assert "| samples/s (whole run) | 64 | 54 | 0.84x |" in summary  # the last log's running figure
    assert load_run(tmp_path / "ort").values("density/embed") == [
        h["density/embed"] for h in json.loads((tmp_path / "ort" / "trainer_state.json").read_text())["log_history"]
    ]
