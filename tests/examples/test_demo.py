"""`make demo`'s code path, shortened: the demo trains in PyTorch and through ORT, each in its own
process, and writes both side by side and one report of both."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_offline_through_pytorch_and_ort(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo" / "run_demo.py"), "--output_dir", str(tmp_path),
         "--max_steps", "4"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "=== ORT vs PyTorch" in proc.stdout and "INPUT TYPE" not in proc.stdout  # table every 20 steps
    assert "Setting accelerator" not in proc.stdout + proc.stderr  # DeepSpeed is installed, not used
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    assert comparison["ort"]["engine"] == "ort" and comparison["pytorch"]["engine"] == "pytorch"
    assert 0.0 <= comparison["ort"]["metric_value"] <= 1.0 and comparison["max_loss_difference"] < 0.1
    for chart in ("loss.png", "memory.png", "density.png", "report.md"):
        assert (tmp_path / "report" / chart).exists(), chart


def test_review_splits_are_balanced_and_disjoint():
    sys.path.insert(0, str(ROOT / "examples" / "demo"))
    from reviews import DEV_ASPECTS, TRAIN_ASPECTS, build_splits

    train, dev = build_splits()
    assert not set(TRAIN_ASPECTS) & set(DEV_ASPECTS)
    assert not {s for s, _ in train} & {s for s, _ in dev}
    for rows in (train, dev):
        share = sum(y for _, y in rows) / len(rows)
        assert 0.4 < share < 0.6
