"""`ort-hf bench` mechanics on a tiny run: fresh worker processes, the JSON, the markdown table,
the chart, and the ORT variant really ran ORT. No timing is asserted (benchmarks are not tests)."""

import csv
import json

import pytest
import torch

from ort_hf.bench.cpu import cpu_record, describe
from ort_hf.cli import main

ROW_KEYS = {
    "workload",
    "variant",
    "engine",
    "samples_per_s",
    "tokens_per_s",
    "step_median_ms",
    "step_p25_ms",
    "step_p75_ms",
    "run_peak_mb",
    "export_s",
    "first_step_s",
    "final_step",
    "final_loss",
    "speedup",
    "train_runtime_s",
    "whole_run_speedup",
}


def test_tiny_bench_writes_table_json_and_chart(tiny_model_dir, tmp_path, capsys):
    train = tmp_path / "train.csv"
    rows = ["good film", "a dull , tedious mess", "wonderful acting and a clever plot", "bad", "fine", "awful"]
    with open(train, "w", newline="") as f:
        csv.writer(f).writerows([("sentence", "label"), *((s, i % 2) for i, s in enumerate(rows))])
    goals_file = tmp_path / "targets.toml"
    goals_file.write_text('[every_workload]\nat_least = 0.97\n[init]\nworkloads = ["sst2-dynamic"]\nat_most_s = 5\n')
    root = tmp_path / "bench"
    out = root / cpu_record()["key"]  # this CPU kind's folder: another kind's results go beside it
    code = main(
        [
            "bench",
            "--out",
            str(root),
            "--workloads",
            "sst2-dynamic,mlm",
            "--variants",
            "eager,ort",
            "--rounds",
            "1",
            "--steps",
            "3",
            "--warmup_steps",
            "1",
            "--batch_size",
            "2",
            "--seq_len",
            "32",
            "--model_dir",
            str(tiny_model_dir),
            "--train_file",
            str(train),
            "--targets",
            str(goals_file),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "skipping workload mlm" in printed  # a CSV is no text for MLM: skipped, said so, no crash

    report = json.loads((out / "bench.json").read_text())
    rows_by_variant = {r["variant"]: r for r in report["rows"] if r["workload"] == "sst2-dynamic"}
    assert set(rows_by_variant) == {"eager", "ort"}
    for row in rows_by_variant.values():
        assert row["status"] == "ok", row
        assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
        assert row["final_step"] == 4 and row["rounds_ok"] == 1
    assert rows_by_variant["ort"]["engine"] == "ort"
    assert rows_by_variant["eager"]["engine"] == "pytorch"
    assert rows_by_variant["eager"]["speedup"] == 1.0
    assert rows_by_variant["eager"]["whole_run_speedup"] == 1.0
    eager_s, ort_s = (rows_by_variant[v]["train_runtime_s"] for v in ("eager", "ort"))
    assert rows_by_variant["ort"]["whole_run_speedup"] == pytest.approx(eager_s / ort_s)
    assert rows_by_variant["ort"]["export_s"] > 0
    assert "final_loss_rel_diff" in rows_by_variant["ort"]
    assert {"command", "threads", "versions"} <= set(report["conditions"])
    assert "PyTorch's CPU kernels: " in report["conditions"]["machine"]  # ratios depend on the CPU
    assert report["conditions"]["cpu"] == cpu_record()
    assert rows_by_variant["ort"]["break_even_steps"] is None or rows_by_variant["ort"]["break_even_steps"] >= 1
    goals = {t["target"]: t for t in report["targets"]}
    speedup = rows_by_variant["ort"]["speedup"]
    assert goals["no workload's ort below 0.97x eager (median)"]["met"] == (speedup >= 0.97)
    assert "sst2-dynamic: ORT export + session <= 5 s" in goals
    assert not any("final loss" in t for t in goals)  # the model's dropout is on: losses are not compared
    assert "dropout model default" in report["conditions"]["settings"]
    ort_row = rows_by_variant["ort"]
    # The export's peak, read when the trace ends, lies within the first step's, which lies within the run's.
    assert 0 < ort_row["export_peak_mb"] <= ort_row["first_step_peak_mb"] <= ort_row["run_peak_mb"]
    assert rows_by_variant["eager"]["export_peak_mb"] is None
    runs = [r for r in report["runs"] if r["status"] == "ok"]
    assert len(runs) == 2 and all(r["samples"] == 6 and r["omp_num_threads"] for r in runs)
    by_variant = {run["variant"]: run for run in runs}
    assert by_variant["ort"]["ort_intra_op_threads"] == by_variant["ort"]["torch_threads"]  # same threads
    assert by_variant["ort"]["ort_intra_op_spinning"] is False  # the CPU default
    assert by_variant["ort"]["torch_threads_in_graph"] == 1  # the CPU default
    assert by_variant["eager"]["ort_intra_op_threads"] is None
    for run in runs:  # throughput from whole loop cycles, each one at least its step's compute
        assert len(run["step_times_s"]) == len(run["compute_times_s"]) == 3
        assert all(cycle >= compute > 0 for cycle, compute in zip(run["step_times_s"], run["compute_times_s"]))
        assert run["samples_per_s"] == pytest.approx(run["samples"] / sum(run["step_times_s"]))
        # The Trainer's clock covers the whole run: the warm-up (export) step and the measured ones.
        assert run["train_runtime_s"] >= sum(run["warmup_s"]) + sum(run["step_times_s"])

    table = (out / "bench.md").read_text()
    assert "train() s (vs eager)" in table
    assert "| sst2-dynamic | ort | ort |" in table and "| sst2-dynamic | eager | pytorch |" in table
    assert table in printed
    assert table.startswith(f"# ort-hf bench\n\nCPU: {describe(cpu_record())} (results folder {cpu_record()['key']})")
    assert "whole run faster from step" in table
    by_cpu = (root / "by-cpu.md").read_text()
    assert "| sst2-dynamic | ort |" in by_cpu and f"## {describe(cpu_record())}" in by_cpu
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_export_peak_is_read_where_the_trace_calls_only_the_backbone():
    """With the fused LM-head loss the graph calls the backbone, not the model's forward."""
    from tiny_models import FAMILIES, build

    from ort_hf.bench.timing import ExportPeak

    model = build(FAMILIES["llama-clm"])
    peak = ExportPeak(model)
    ids = torch.randint(0, 100, (2, 8))
    model.model(input_ids=ids)  # outside a trace: nothing read
    assert peak.peak_mb is None

    class Backbone(torch.nn.Module):  # as the fused loss's graph calls it
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(input_ids=x).last_hidden_state

    torch.jit.trace(Backbone(model.model), (ids,), check_trace=False)
    assert peak.peak_mb is not None and peak.peak_mb > 0
