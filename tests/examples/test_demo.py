"""`make demo`'s code path, shortened: the demo trains in PyTorch and through ORT, each in its own
process, and writes both side by side, the whole-run ratio and break-even point with the CPU they
hold for, and one report of both."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ort_hf.bench.cpu import describe

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"  # as `make demo` finds it (SST-2 is not committed)


def test_demo_runs_offline_through_pytorch_and_ort(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo" / "run_demo.py"),
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "4",
            "--data_dir",
            str(DATA),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,  # a hang, not a slow shared machine
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "=== ORT vs PyTorch" in proc.stdout and "INPUT TYPE" not in proc.stdout  # table every 20 steps
    assert "Setting accelerator" not in proc.stdout + proc.stderr  # DeepSpeed is installed, not used
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    assert comparison["ort"]["engine"] == "ort" and comparison["pytorch"]["engine"] == "pytorch"
    assert 0.0 <= comparison["ort"]["metric_value"] <= 1.0 and comparison["max_loss_difference"] < 0.1
    for chart in ("loss.png", "memory.png", "density.png", "report.md"):
        assert (tmp_path / "report" / chart).exists(), chart
    # The run's data and length are stated, and what the whole run gained, on which CPU.
    sst2 = (DATA / "glue" / "SST-2" / "train.tsv").is_file()
    assert ("Data: SST-2 (GLUE's movie-review sentiment" if sst2 else "SST-2 not found") in proc.stdout
    assert "64 training sentences" in proc.stdout or not sst2  # 4 steps of 16
    assert "whole run faster from step" in proc.stdout and "whole run (train()) s" in proc.stdout
    cpu = comparison["cpu"]
    assert f"On this CPU ({describe(cpu)}) ORT" in proc.stdout
    assert comparison["verdict"] in proc.stdout
    assert ("did NOT win" in comparison["verdict"]) == (
        comparison["pytorch"]["train_runtime_s"] <= comparison["ort"]["train_runtime_s"]
    )
    assert comparison["committed_figures"] and all(f in proc.stdout for f in comparison["committed_figures"])


def test_demo_names_where_orts_committed_figures_come_from(tmp_path):
    sys.path.insert(0, str(ROOT / "examples" / "demo"))
    from run_demo import committed_wins, load_data

    wins = committed_wins()
    # The demo's own shape first, each figure with its CPU kind and the file it is read from.
    assert wins[0].startswith("sst2-dynamic: ") and all("cores (docs/results/bench/" in w for w in wins)
    assert not any(w.startswith("sst2-padded") for w in wins)  # its ratio includes the padding trim
    train, dev, about = load_data(tmp_path, max_steps=10)  # no SST-2 here: the review set, said so
    assert about.startswith("SST-2 not found") and len(train) > 10 and dev


def test_review_splits_are_balanced_and_disjoint():
    sys.path.insert(0, str(ROOT / "examples" / "demo"))
    from reviews import DEV_ASPECTS, TRAIN_ASPECTS, build_splits

    train, dev = build_splits()
    assert not set(TRAIN_ASPECTS) & set(DEV_ASPECTS)
    assert not {s for s, _ in train} & {s for s, _ in dev}
    for rows in (train, dev):
        share = sum(y for _, y in rows) / len(rows)
        assert 0.4 < share < 0.6
